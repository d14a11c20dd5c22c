"""The schema that the migrations and the engine's functions make, as one committed file.

`services/runtime/schema.sql` is a `pg_dump --schema-only` of a database migrated from
nothing (tables, types, functions, triggers, grants), stripped of what changes from one
dump to the next (comments, the dump's random restrict key). It is the one place that
shows the whole schema as it is; `make schema` writes it again, and `make lint` (this
module with `--check`) fails when the migrations and the file drift apart.

    python -m runwire.infra.schema [--check]
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from runwire.infra.postgres import EmbeddedPostgres, postgres_bin_dir
from runwire.runtime.store import migrate

SCHEMA_FILE = Path(__file__).resolve().parents[1] / "services" / "runtime" / "schema.sql"
HEADER = (
    "-- runwire's schema: what the migrations and sql/functions/ make of an empty database,\n"
    "-- dumped by PostgreSQL {major} (`make schema` writes this file; never edit it by hand).\n"
)
_MAJOR = re.compile(r"^-- runwire's schema.*\n-- dumped by PostgreSQL (\d+)", re.MULTILINE)
# Lines of a dump that differ between two dumps of one schema: comments (with the
# versions of server and pg_dump) and psql's restrict guard with its random key.
_NOISE = re.compile(r"^(--.*|\\(un)?restrict .*)$")


def normalize(dump: str) -> str:
    """`dump` without its noise, with runs of blank lines made one."""
    lines = [line for line in dump.splitlines() if not _NOISE.match(line)]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
    return text + "\n"


def dump(url: str) -> str:
    """The schema of the database at `url`, normalized (pg_dump from the wheel)."""
    done = subprocess.run(
        [
            str(postgres_bin_dir() / "pg_dump"),
            "--schema-only",
            "--no-owner",
            "--no-comments",
            url,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"pg_dump failed ({done.returncode}): {done.stderr.strip()}")
    return normalize(done.stdout)


def server_major() -> int:
    """The major version of the wheel's PostgreSQL."""
    out = subprocess.run(
        [str(postgres_bin_dir() / "postgres"), "--version"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    match = re.search(r"(\d+)\.\d+", out)
    if match is None:
        raise RuntimeError(f"cannot read PostgreSQL's version from {out!r}")
    return int(match.group(1))


def committed_major(text: str) -> int | None:
    """The PostgreSQL major version that dumped the committed file."""
    match = _MAJOR.search(text)
    return int(match.group(1)) if match else None


def render(url: str) -> str:
    """The file's text for the (migrated) database at `url`."""
    return HEADER.format(major=server_major()) + "\n" + dump(url)


async def _fresh_schema() -> str:
    with tempfile.TemporaryDirectory(prefix="runwire-schema-") as folder:
        postgres = EmbeddedPostgres(Path(folder) / "data", durable=False)
        postgres.init()
        url = postgres.start()
        try:
            await migrate(url)
            return render(url)
        finally:
            postgres.stop()


def drift(expected: str, actual: str) -> str:
    """A unified diff from the committed file to what the migrations make ('' if none)."""
    return "".join(
        difflib.unified_diff(
            expected.splitlines(keepends=True),
            actual.splitlines(keepends=True),
            "services/runtime/schema.sql (committed)",
            "what the migrations make",
        )
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m runwire.infra.schema", description=__doc__)
    parser.add_argument(
        "--check", action="store_true", help="fail if the committed file is not current"
    )
    args = parser.parse_args(argv)
    actual = asyncio.run(_fresh_schema())
    if not args.check:
        SCHEMA_FILE.write_text(actual)
        print(f"wrote {SCHEMA_FILE.relative_to(SCHEMA_FILE.parents[2])}")
        return
    expected = SCHEMA_FILE.read_text() if SCHEMA_FILE.exists() else ""
    if committed_major(expected) not in (None, server_major()):
        print(
            f"schema: not compared (the file was dumped by PostgreSQL "
            f"{committed_major(expected)}, this is {server_major()})"
        )
        return
    diff = drift(expected, actual)
    if diff:
        sys.stdout.write(diff)
        print("schema: services/runtime/schema.sql is not what the migrations make (make schema)")
        raise SystemExit(1)
    print("schema: services/runtime/schema.sql is what the migrations make")


if __name__ == "__main__":
    main()
