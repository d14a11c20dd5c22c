"""`runwire tenant add|remove|list|rotate|finish-rotation`: the tenants of a stack,
managed from its folder (`.runwire/`, where its identities and API keys are). The command
comes with the stack's tools, not with the client: the `runwire` CLI finds it through
the `runwire.commands` entry point (see pyproject.toml), so the client imports nothing of
`runwire.infra`.
"""

import argparse
import asyncio
import sys
from datetime import timedelta
from pathlib import Path

from runwire.client.sdk import Client, ClientError
from runwire.client.settings import find_env_file
from runwire.contracts.errors import ErrorCode
from runwire.contracts.subjects import DEFAULT_INBOX, DEFAULT_PREFIX
from runwire.infra.auth import (
    IDENTITIES_FILE,
    OPERATOR_ENV_FILE,
    Identities,
    add_tenant,
    finish_rotation,
    read_env_file,
    remove_tenant,
    rotate_tenant,
)

EXIT_FAILED = 1
EXIT_USAGE = 2
# How long a rotated tenant's previous API keys are still accepted, by default.
DEFAULT_KEY_GRACE_S = 3600.0
# How long `tenant remove` tries to reach the stack to end the tenant's runs.
END_TENANT_CONNECT_S = 5.0
# ... and how long it waits before asking again when refused (the server was reloading).
END_TENANT_RETRY_S = 0.2


def command(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Add `tenant` to the `runwire` command's subcommands."""
    tenant = sub.add_parser(
        "tenant", help="add or remove a tenant of the local stack (its identity on NATS)"
    )
    tenant.add_argument(
        "action",
        choices=("add", "remove", "list", "rotate", "finish-rotation"),
        help="rotate: a new password and API key, the previous ones still accepted (the "
        "key for --grace) until finish-rotation",
    )
    tenant.add_argument("name", nargs="?", help="the tenant (all but list)")
    tenant.add_argument(
        "--grace",
        type=float,
        default=DEFAULT_KEY_GRACE_S,
        help="rotate: seconds the previous API keys are still accepted (default: an hour)",
    )
    tenant.add_argument(
        "--root", type=Path, help="the stack's folder (default: the nearest .runwire/)"
    )
    tenant.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """`runwire tenant add|remove|list`: no connection needed, only the stack's folder."""
    found = find_env_file()
    root = args.root or (found.parent if found is not None else None)
    if root is None:
        print("runwire: no local stack found (no .runwire/ here; `make up`)", file=sys.stderr)
        return EXIT_FAILED
    if args.action == "list":
        for name in Identities.load(root / IDENTITIES_FILE).tenants:
            print(name)
        return 0
    if not args.name:
        print(f"runwire: tenant {args.action} needs the tenant's name", file=sys.stderr)
        return EXIT_USAGE
    if args.action == "add":
        env_file, told = add_tenant(root, args.name)
        print(f"tenant {args.name}: its client settings (NATS identity, API key) are in {env_file}")
        print(f"  runwire --env {env_file} submit --tokens hi --watch")
    elif args.action == "rotate":
        try:
            env_file, told = rotate_tenant(root, args.name, timedelta(seconds=args.grace))
        except KeyError:
            print(f"runwire: no tenant {args.name!r}", file=sys.stderr)
            return EXIT_FAILED
        except ValueError as exc:
            print(f"runwire: {exc} (`runwire tenant finish-rotation {args.name}`)", file=sys.stderr)
            return EXIT_FAILED
        print(f"tenant {args.name}: a new NATS identity and API key are in {env_file}")
        print(
            f"  the previous password is accepted until `runwire tenant finish-rotation "
            f"{args.name}`, the previous API keys for {args.grace:g} s (or until then)"
        )
    elif args.action == "finish-rotation":
        had, told = finish_rotation(root, args.name)
        if not had:
            print(f"runwire: tenant {args.name!r} has no rotation under way", file=sys.stderr)
            return EXIT_FAILED
        print(f"tenant {args.name}: its previous password and API keys are refused now")
    else:
        had, told = remove_tenant(root, args.name)
        if not had:
            print(f"runwire: no tenant {args.name!r}", file=sys.stderr)
            return EXIT_FAILED
        print(f"tenant {args.name} removed; its connections are closed")
        print(f"  {asyncio.run(end_tenant(root, args.name))}")
    if not told:
        print("(nats-server is not running: it takes the change when it starts)")
    return 0


async def end_tenant(root: Path, tenant: str) -> str:
    """Cancel a removed tenant's active and queued runs, as the stack's operator; what
    was done, in a line."""
    operator = read_env_file(root / OPERATOR_ENV_FILE)
    if "RUNWIRE_NATS_URL" not in operator:
        return f"its runs were left as they are (no operator settings in {root})"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + END_TENANT_CONNECT_S
    while True:
        try:
            client = await Client.connect(
                operator["RUNWIRE_NATS_URL"],
                tenant=tenant,
                prefix=operator.get("RUNWIRE_PREFIX", DEFAULT_PREFIX),
                user=operator.get("RUNWIRE_NATS_USER"),
                password=operator.get("RUNWIRE_NATS_PASSWORD"),
                connect_timeout=max(deadline - loop.time(), 0.1),
                # The removed tenant's inbox is nobody's now: replies come to NATS's default.
                inbox=DEFAULT_INBOX,
            )
            break
        except ClientError as exc:
            # The server was told to read its configuration a moment ago, and while it
            # does, it may refuse an identity it keeps: ask again until the deadline.
            if exc.code != ErrorCode.UNAUTHORIZED or loop.time() >= deadline:
                return f"its runs were left as they are ({exc.message})"
            await asyncio.sleep(END_TENANT_RETRY_S)
    async with client:
        try:
            canceled = await client.end_tenant()
        except ClientError as exc:
            return f"its runs were left as they are ({exc.message})"
    return f"{len(canceled)} of its active or queued runs canceled"
