"""`runwire tenant add|remove|list|rotate|finish-rotation`: the tenants of a stack,
managed from its folder (`.runwire/`, where its identities and API keys are). The command
comes with the stack's tools, not with the client: the `runwire` CLI finds it through
the `runwire.commands` entry point (see pyproject.toml), so the client imports nothing of
`runwire.infra`.
"""

import argparse
import asyncio
import contextlib
import sys
from datetime import timedelta
from pathlib import Path

import nats.js.errors

from runwire.client.sdk import Client, ClientError
from runwire.client.settings import find_env_file
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
# How long it waits for the tenant's canceled runs to end before forgetting it, and how
# often it asks whether they have.
FORGET_WAIT_S = 60.0
FORGET_POLL_S = 0.5


def command(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Add `tenant` to the `runwire` command's subcommands."""
    tenant = sub.add_parser(
        "tenant", help="add or remove a tenant of the local stack (its identity on NATS)"
    )
    tenant.add_argument(
        "action",
        choices=("add", "remove", "list", "rotate", "finish-rotation", "forget"),
        help="remove: revoke its identity, end its runs and forget it (what Postgres and "
        "the streams keep of it); forget: what remove does after the revocation, for a "
        "removed tenant whose runs had not ended yet; rotate: a new password and API key, "
        "the previous ones still accepted (the key for --grace) until finish-rotation",
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
    elif args.action == "forget":
        if args.name in Identities.load(root / IDENTITIES_FILE).tenants:
            print(
                f"runwire: tenant {args.name!r} is not removed (`runwire tenant remove "
                f"{args.name}` ends and forgets it)",
                file=sys.stderr,
            )
            return EXIT_FAILED
        for line in asyncio.run(end_tenant(root, args.name)):
            print(f"  {line}")
        return 0
    else:
        had, told = remove_tenant(root, args.name)
        if not had:
            print(f"runwire: no tenant {args.name!r}", file=sys.stderr)
            return EXIT_FAILED
        print(f"tenant {args.name} removed; its connections are closed")
        for line in asyncio.run(end_tenant(root, args.name)):
            print(f"  {line}")
    if not told:
        print("(nats-server is not running: it takes the change when it starts)")
    return 0


async def end_tenant(root: Path, tenant: str, *, wait: float = FORGET_WAIT_S) -> list[str]:
    """As the stack's operator, end a removed tenant: cancel its active and queued runs,
    wait (up to `wait` seconds) until they ended, then forget it: delete what Postgres
    keeps of it, purge its frames, events and threads from the streams and delete its
    consumers, so that a tenant given its name later inherits nothing. What was done, a
    line each."""
    client = await _as_operator(root, tenant)
    if isinstance(client, str):
        return [f"its runs were left as they are ({client})"]
    async with client:
        try:
            canceled = await client.end_tenant()
        except ClientError as exc:
            return [f"its runs were left as they are ({exc.message})"]
        said = [f"{len(canceled)} of its active or queued runs canceled"]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while not (forgotten := await client.forget_tenant()).forgotten:
            if loop.time() >= deadline:
                return [
                    *said,
                    f"{forgotten.active} of its runs are still ending: it is not forgotten "
                    f"yet (`runwire tenant forget {tenant}` once they ended)",
                ]
            await asyncio.sleep(FORGET_POLL_S)
        said.append(
            f"forgotten: {forgotten.runs} runs (with their frames, events and effects), "
            f"{forgotten.releases} workflow releases, its budget and policy"
        )
        said.append(await _purge(client, tenant))
    return said


async def _as_operator(root: Path, tenant: str) -> Client | str:
    """A connection as the stack's operator acting on `tenant`, or why there is none."""
    operator = read_env_file(root / OPERATOR_ENV_FILE)
    if "RUNWIRE_NATS_URL" not in operator:
        return f"no operator settings in {root}"
    try:
        return await Client.connect(
            operator["RUNWIRE_NATS_URL"],
            tenant=tenant,
            prefix=operator.get("RUNWIRE_PREFIX", DEFAULT_PREFIX),
            user=operator.get("RUNWIRE_NATS_USER"),
            password=operator.get("RUNWIRE_NATS_PASSWORD"),
            tls_ca=Path(ca) if (ca := operator.get("RUNWIRE_NATS_TLS_CA")) else None,
            connect_timeout=END_TENANT_CONNECT_S,
            # The removed tenant's inbox is nobody's now: replies come to NATS's default.
            inbox=DEFAULT_INBOX,
        )
    except ClientError as exc:
        return exc.message


async def _purge(client: Client, tenant: str) -> str:
    """Purge the tenant's runs' frames, its events and its LangGraph threads from the
    streams, and delete the consumers that read them; what was done."""
    subjects = client.subjects
    js = client.nc.jetstream()
    own = {
        subjects.run_frames_stream: f"{subjects.prefix}.{tenant}.runs.>",
        subjects.events_stream: f"{subjects.prefix}.{tenant}.events.>",
        f"KV_{subjects.threads_bucket}": f"$KV.{subjects.threads_bucket}.{tenant}.>",
    }
    deleted = 0
    for stream, subject in own.items():
        try:
            await js.purge_stream(stream, subject=subject)
        except nats.js.errors.NotFoundError:
            continue  # no such stream yet (no thread was ever made)
        if stream.startswith("KV_"):
            continue
        for consumer in await js.consumers_info(stream):
            config = consumer.config
            filters = [config.filter_subject or "", *(config.filter_subjects or [])]
            if any(f.startswith(f"{subjects.prefix}.{tenant}.") for f in filters):
                with contextlib.suppress(nats.js.errors.NotFoundError):
                    await js.delete_consumer(stream, consumer.name)
                    deleted += 1
    return f"its frames, events and threads purged from the streams; {deleted} consumers deleted"
