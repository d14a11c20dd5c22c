"""`runwire-migrate`: apply the Postgres migrations as the owner of the schema.

Services apply migrations themselves when they connect as a role that may (one URL for
everything, as in tests). Where each service connects as its own role (migration 0015),
they may not: run this first, with the owner's URL in `RUNWIRE_DATABASE_URL` (or as the
argument); services that start meanwhile wait for it.
"""

import argparse
import asyncio
import os
import sys

from runwire.runtime.errors import RunwireError
from runwire.runtime.store import migrate


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="runwire-migrate", description=__doc__.split("\n")[0])
    parser.add_argument(
        "database_url",
        nargs="?",
        default=os.environ.get("RUNWIRE_DATABASE_URL"),
        help="the owner's URL (default: RUNWIRE_DATABASE_URL)",
    )
    args = parser.parse_args(argv)
    if not args.database_url:
        parser.error("give the owner's database URL, or set RUNWIRE_DATABASE_URL")
    try:
        applied = asyncio.run(migrate(args.database_url, replace_newer=True))
    except (OSError, RunwireError) as exc:
        sys.stderr.write(f"runwire-migrate: {exc}\n")
        raise SystemExit(1) from None
    sys.stdout.write(
        "".join(f"applied {name}\n" for name in applied) or "every migration was applied already\n"
    )


if __name__ == "__main__":
    main()
