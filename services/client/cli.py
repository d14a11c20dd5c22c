"""The `runwire` command: submit runs, watch their frames, get and cancel them, `top`,
`runners` (what each service loaded) and `health` (what a readiness probe runs).

It finds the stack from `--nats-url`, `RUNWIRE_NATS_URL`, or the `.runwire/env` file
that `make up` writes.
"""

import argparse
import asyncio
import json
import os
import socket
import sys
from datetime import datetime
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from runwire.client import cli_views as views
from runwire.client.sdk import HEALTH_WAIT_S, PROBE_WAIT_S, Client, ClientError
from runwire.client.settings import ENV_FILE_VARIABLE, load_settings
from runwire.client.top import run_top
from runwire.contracts.errors import ErrorBody, ErrorCode
from runwire.contracts.health import HealthReply
from runwire.contracts.identities import SERVICES, is_tenant_user, service_user
from runwire.contracts.status import RunStatus
from runwire.contracts.subjects import service_inbox

EXIT_FAILED = views.EXIT_FAILED
EXIT_USAGE = 2
# Commands that other parts of runwire add to this one (the stack's `tenant`).
COMMANDS_GROUP = "runwire.commands"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="runwire", description="Submit and follow runwire runs.")
    parser.add_argument("--nats-url", help="NATS URL (default: RUNWIRE_NATS_URL or .runwire/env)")
    parser.add_argument("--tenant", help="tenant (default: RUNWIRE_TENANT or 'default')")
    parser.add_argument(
        "--env",
        metavar="FILE",
        help="settings file to use instead of the nearest .runwire/env, winning over the "
        "shell's RUNWIRE_* variables (a tenant's, from `runwire tenant add`, or "
        ".runwire/operator.env for admin commands)",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    submit = sub.add_parser("submit", help="submit a run of the scripted runner")
    submit.add_argument("--tokens", nargs="+", metavar="TOKEN", help="tokens the run emits")
    submit.add_argument("--input", help="the run's input as JSON (instead of --tokens)")
    submit.add_argument("--runner", default="scripted")
    submit.add_argument("--token-delay-ms", type=int, default=0)
    submit.add_argument("--request-id", help="idempotency key (default: a new one)")
    submit.add_argument("--session", dest="session_id")
    submit.add_argument("--multitask", choices=["interrupt", "enqueue", "reject", "coalesce"])
    submit.add_argument(
        "--coalesce-ms", type=int, help="coalesce: wait this long for more inputs to join"
    )
    submit.add_argument("--max-attempts", type=int)
    submit.add_argument("--attempt-timeout-ms", type=int)
    submit.add_argument(
        "--priority", type=int, help="among the tenant's waiting runs, higher first (-10..10)"
    )
    submit.add_argument(
        "--concurrency-key", help="runs of one key hold at most the tenant's limit at once"
    )
    submit.add_argument("--delay-ms", type=int, help="start no earlier than this after now")
    submit.add_argument("--not-before", type=_time, help="start no earlier than (RFC 3339)")
    submit.add_argument("--workflow", metavar="RELEASE_ID", help="run this release's workflow")
    submit.add_argument("--version", type=int, help="the release's version (default: highest)")
    submit.add_argument("--watch", action="store_true", help="stream the run's text")

    release = sub.add_parser("release", help="publish a workflow release from a JSON file")
    release.add_argument("release_id")
    release.add_argument("version", type=int)
    release.add_argument("file", type=Path, help="the definition: {nodes: [...], edges: [...]}")

    watch = sub.add_parser("watch", help="stream a run's frames from a cursor")
    watch.add_argument("run_id")
    watch.add_argument("--after", type=int, default=0, help="last seq already seen")
    watch.add_argument("--frames", action="store_true", help="print every frame as JSON")

    get = sub.add_parser("get", help="print a run's summary")
    get.add_argument("run_id")
    get.add_argument("--nodes", action="store_true", help="a workflow run's nodes, as a tree")
    get.add_argument(
        "--watch",
        action="store_true",
        help="with --nodes: print the tree again each time it changes, until the run ends",
    )

    cancel = sub.add_parser("cancel", help="cancel a run")
    cancel.add_argument("run_id")

    reschedule = sub.add_parser("reschedule", help="move the start of a delayed run")
    reschedule.add_argument("run_id")
    when = reschedule.add_mutually_exclusive_group(required=True)
    when.add_argument("--delay-ms", type=int, help="start no earlier than this after now")
    when.add_argument("--not-before", type=_time, help="start no earlier than (RFC 3339)")

    runs = sub.add_parser("list", help="the tenant's runs, newest first")
    runs.add_argument("--status", choices=[s.value for s in RunStatus], help="of this status")
    runs.add_argument("--runner", help="of this runner")
    runs.add_argument("--session", help="of this session")
    for edge, words in (("after", "at or after"), ("before", "before")):
        runs.add_argument(f"--created-{edge}", type=_time, help=f"created {words} (RFC 3339)")
    runs.add_argument("--limit", type=int, default=20, help="how many (default 20)")
    runs.add_argument("--before", type=int, help="the page after the one that said so")

    resume = sub.add_parser("resume", help="answer the question a waiting run asks")
    resume.add_argument("run_id")
    resume.add_argument(
        "--value", type=_json, default=None, help="the answer, as JSON (default: null)"
    )
    resume.add_argument("--wait-id", help="answer this wait only (from its wait frame)")
    resume.add_argument("--request-id", help="the answer's idempotency key")

    signal = sub.add_parser("signal", help="send a run a signal it waits (or will wait) for")
    signal.add_argument("run_id")
    signal.add_argument("name")
    signal.add_argument(
        "--payload", type=_json, default=None, help="what it carries, as JSON (default: null)"
    )
    signal.add_argument("--request-id", help="the signal's idempotency key")

    events = sub.add_parser("events", help="follow every run transition of the tenant, live")
    events.add_argument("--run", dest="run_id", default="*", help="only this run")

    budget = sub.add_parser(
        "budget",
        help="print the tenant's budget, quotas, share and queue; with options, set them first",
    )
    for flag in ("--tokens", "--cost", "--max-active-runs", "--max-runs-per-day"):
        budget.add_argument(flag, help="a limit, or 'none' to remove it")
    budget.add_argument(
        "--share", help="its weight in the fair share of executor slots, or 'none' (1)"
    )
    budget.add_argument(
        "--max-queued-runs", help="its queue's capacity, or 'none' (the stack's default)"
    )
    budget.add_argument(
        "--max-runs-per-key",
        help="runs of one concurrency key holding a job at once, or 'none' (no limit)",
    )

    limit = sub.add_parser("limit", help="rate limits of model providers (an operator's)")
    verbs = limit.add_subparsers(dest="action", required=True)
    setting = verbs.add_parser("set", help="limit a provider key or model, e.g. openai:gpt-4o")
    setting.add_argument("key")
    setting.add_argument("--tpm", type=int, help="tokens per minute (prompt and answer)")
    setting.add_argument("--rpm", type=int, help="requests per minute")
    verbs.add_parser("remove", help="remove a rate limit").add_argument("key")
    verbs.add_parser("list", help="the limits, their last minute and the runs waiting")

    schedule = sub.add_parser("schedule", help="the tenant's schedules: runs at cron times")
    actions = schedule.add_subparsers(dest="action", required=True)
    add = actions.add_parser("add", help="create or replace a schedule")
    add.add_argument("name")
    add.add_argument("--cron", required=True, help="five fields, or six with seconds first")
    add.add_argument("--tz", default="UTC", help="an IANA time zone (default UTC)")
    add.add_argument("--runner", default="scripted")
    add.add_argument("--input", type=_json, default={}, help="the runs' input as JSON")
    add.add_argument("--overlap", choices=["skip", "buffer", "allow"], default="skip")
    add.add_argument("--catch-up-s", type=int, default=0, help="fires missed this long ago run")
    add.add_argument("--paused", action="store_true")
    for verb, words in (("pause", "no fires"), ("resume", "fire again"), ("remove", "remove")):
        actions.add_parser(verb, help=f"{words}: a schedule").add_argument("name")
    actions.add_parser("list", help="the tenant's schedules")
    backfill = actions.add_parser("backfill", help="make the runs of past fires, each once")
    backfill.add_argument("name")
    backfill.add_argument("--from", dest="start", type=_time, required=True, help="RFC 3339")
    backfill.add_argument("--to", dest="end", type=_time, required=True, help="RFC 3339")

    hooks = sub.add_parser(
        "webhooks",
        help="print the tenant's webhook endpoints and failed deliveries; with options, set them",
    )
    hooks.add_argument(
        "--url", action="append", default=[], help="an endpoint (again for more); replaces all"
    )
    hooks.add_argument(
        "--events", default="ended", help="what the endpoints hear: ended, waiting (default ended)"
    )
    hooks.add_argument("--clear", action="store_true", help="remove every endpoint")
    hooks.add_argument(
        "--rotate-secret", action="store_true", help="a new signing secret (printed once)"
    )

    policy = sub.add_parser(
        "policy", help="print the tenant's policy; with --effects, set it first"
    )
    policy.add_argument(
        "--effects",
        help="the effect kinds the tenant's runs may perform, comma-separated, or 'any' "
        "(until a policy is set: none); an operator's command (--env .runwire/operator.env)",
    )

    top = sub.add_parser("top", help="live view: queue, executors, throughput, recent runs")
    top.add_argument("--once", action="store_true", help="print one snapshot as text and exit")

    runners = sub.add_parser(
        "runners",
        help="the runners each executor and submitter loaded, and those it serves or accepts",
    )
    runners.add_argument(
        "--timeout",
        type=float,
        default=HEALTH_WAIT_S,
        metavar="S",
        help=f"how long to wait for the replicas' answers (default: {HEALTH_WAIT_S:g} s)",
    )

    health = sub.add_parser(
        "health",
        help="ask every replica of a service for its health; exit 0 when one is ok "
        "(with --local: a readiness probe)",
    )
    health.add_argument("service", choices=SERVICES, help="the service whose replicas to ask")
    health.add_argument(
        "--local",
        action="store_true",
        help="count only the replicas on this host (in Kubernetes, this pod's own)",
    )
    health.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="S",
        help=(
            f"how long to wait for the replicas' answers (default: {HEALTH_WAIT_S:g} s; "
            f"with --local, at most {PROBE_WAIT_S:g} s: it ends as soon as this host's "
            "replica says it is ok)"
        ),
    )
    # Each adds its subcommand, with a `handler` that runs it (see `main`).
    for command in sorted(entry_points(group=COMMANDS_GROUP), key=lambda ep: ep.name):
        command.load()(sub)
    return parser


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None


def _time(text: str) -> datetime:
    """An RFC 3339 time with its time zone (`Z` or an offset)."""
    try:
        at = datetime.fromisoformat(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not an RFC 3339 time: {exc}") from None
    if at.tzinfo is None:
        raise argparse.ArgumentTypeError("give the time zone: 2026-01-02T03:04:05Z")
    return at


def _submit_input(args: argparse.Namespace) -> dict[str, Any]:
    if args.input:
        value = json.loads(args.input)
        if not isinstance(value, dict):
            raise ValueError("--input must be a JSON object")
        return value
    if not args.tokens:
        raise ValueError("give --tokens or --input")
    return {"tokens": args.tokens, "token_delay_ms": args.token_delay_ms}


async def _schedule(client: Client, args: argparse.Namespace) -> Any:
    """`runwire schedule ACTION`: the tenant's schedules after it."""
    if args.action == "add":
        options = {k: getattr(args, k) for k in ("tz", "runner", "input", "overlap", "paused")}
        return await client.set_schedule(
            args.name, args.cron, catch_up_s=args.catch_up_s, **options
        )
    if args.action in ("pause", "resume"):
        found = [s for s in (await client.schedules()).schedules if s.name == args.name]
        if not found:
            raise ClientError(_not_found(f"no schedule {args.name!r}"))
        kept = found[0].model_dump(include={"tz", "runner", "input", "overlap", "catch_up_s"})
        return await client.set_schedule(
            args.name, found[0].cron, paused=args.action == "pause", **kept
        )
    if args.action == "remove":
        return await client.remove_schedule(args.name)
    if args.action == "backfill":
        return await client.backfill_schedule(args.name, args.start, args.end)
    return await client.schedules()


def _not_found(message: str) -> ErrorBody:
    return ErrorBody(code=ErrorCode.NOT_FOUND, message=message, retryable=False)


async def _health(client: Client, service: str, *, local: bool, wait: float) -> int:
    """Print the health of each replica that answers; 0 when one of those that count is
    ok. With `local`, only the replicas on this host count (a replica's instance is
    `<hostname>:<pid>`), so a probe in a pod checks that pod's service, not another's."""
    host = socket.gethostname()

    def counts(reply: HealthReply) -> bool:
        return not local or reply.instance.rpartition(":")[0] == host

    replies = await client.health(
        service, wait=wait, enough=(lambda r: r.ok and counts(r)) if local else None
    )
    counted = [r for r in replies if counts(r)]
    for reply in counted:
        print(views.health_line(reply), flush=True)
    if any(reply.ok for reply in counted):
        return 0
    if not replies:
        problem = (
            f"no replica of {service} answered within {wait:g} s "
            f"(prefix {client.subjects.prefix}: is {service} running?)"
        )
    elif not counted:
        problem = (
            f"no replica of {service} on this host ({host}) answered; "
            f"{len(replies)} on other hosts did"
        )
    else:
        problem = f"no replica of {service}{' on this host' if local else ''} is ok"
    print(f"runwire: {problem}", file=sys.stderr)
    return EXIT_FAILED


# The services that load runners, and what each does with those of its health reply.
RUNNER_SERVICES = {"executor": "serves", "submitter": "accepts"}


async def _runners(client: Client, wait: float) -> int:
    """Print, per replica of the executor and the submitter, the runners it loaded and
    those it serves (takes jobs of) or accepts (runs of); 0 when each service answered."""
    missing = []
    for service, verb in RUNNER_SERVICES.items():
        replies = await client.health(service, wait=wait)
        if not replies:
            missing.append(service)
        for reply in sorted(replies, key=lambda r: r.instance):
            print(
                f"{service:<10} {reply.instance}  loaded: {', '.join(reply.loaded) or 'none'}"
                f"  {verb}: {', '.join(reply.runners) or 'none yet'}",
                flush=True,
            )
    for service in missing:
        print(
            f"runwire: no replica of {service} answered within {wait:g} s (is it running? "
            f"one whose runner cannot be loaded stops at start, saying why in its log)",
            file=sys.stderr,
        )
    return EXIT_FAILED if missing else 0


async def _main(args: argparse.Namespace) -> int:
    settings = load_settings()
    url = args.nats_url or settings.nats_url
    tenant = args.tenant or settings.tenant
    password = settings.nats_password.get_secret_value() if settings.nats_password else None
    # A replica's probe asks as its service's identity, which hears replies only in its
    # service's own inbox (`_SVC_INBOX_<service>`), no tenant's.
    probing = args.command == "health" and settings.nats_user == service_user(args.service)
    try:
        # No URL unless --nats-url: the client finds it as `settings` did, and can then
        # say where it looked when nothing answers there.
        client = await Client.connect(
            args.nats_url,
            tenant=tenant,
            prefix=settings.prefix,
            user=settings.nats_user,
            password=password,
            inbox=service_inbox(args.service) if probing else None,
            tls_ca=settings.nats_tls_ca,
        )
    except (OSError, TimeoutError) as exc:
        print(
            f"runwire: cannot reach NATS at {url}: {exc} (is the stack up? `make up`)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    async with client:
        if args.command == "submit":
            options = {
                k: v
                for k in (
                    "runner",
                    "session_id",
                    "multitask",
                    "max_attempts",
                    "attempt_timeout_ms",
                    "priority",
                    "concurrency_key",
                    "delay_ms",
                    "not_before",
                    "coalesce_ms",
                )
                if (v := getattr(args, k)) is not None
            }
            if args.workflow is not None:
                options.pop("runner", None)
                wf_input = json.loads(args.input) if args.input else {}
                if not isinstance(wf_input, dict):
                    raise ValueError("--input must be a JSON object")
                reply = await client.submit_workflow(
                    args.workflow,
                    wf_input,
                    version=args.version,
                    request_id=args.request_id,
                    **options,
                )
            else:
                reply = await client.submit(
                    _submit_input(args), request_id=args.request_id, **options
                )
            note = " (duplicate request: the first run)" if reply.duplicate else ""
            print(f"run {reply.run.run_id} {reply.run.status}{note}", flush=True)
            if args.watch:
                return await views.watch(client, reply.run.run_id, 0, False)
            return 0
        if args.command == "watch":
            return await views.watch(client, args.run_id, args.after, args.frames)
        if args.command == "get":
            if args.nodes and args.watch:
                return await views.watch_nodes(client, args.run_id)
            run = await client.get(args.run_id)
            print(views.node_tree(run) if args.nodes else run.model_dump_json(indent=2))
            return 0
        if args.command == "release":
            definition = json.loads(args.file.read_text())
            published = await client.release(args.release_id, args.version, definition)
            state = "published" if published.created else "already published, unchanged"
            print(
                f"release {published.release_id} v{published.version}: {state} "
                f"({published.nodes} nodes, digest {published.digest[:12]})"
            )
            return 0
        if args.command == "events":
            async for event in await client.events(args.run_id):
                code = f" {event.code}" if event.code else ""
                print(
                    f"{event.at.isoformat()} {event.run_id} {event.event} -> {event.status}"
                    f" (attempt {event.attempt}){code}",
                    flush=True,
                )
            return 0
        if args.command == "budget":
            limits = {
                name: None if value.lower() == "none" else int(value)
                for name in (
                    "tokens",
                    "cost",
                    "max_active_runs",
                    "max_runs_per_day",
                    "share",
                    "max_queued_runs",
                    "max_runs_per_key",
                )
                if (value := getattr(args, name)) is not None
            }
            budget = await client.set_budget(**limits) if limits else await client.budget()
            print(budget.model_dump_json(indent=2, exclude={"v", "ok"}))
            return 0
        if args.command == "limit":
            if args.action == "set" and args.tpm is None and args.rpm is None:
                raise ValueError("give --tpm, --rpm or both")
            rates = await (
                client.set_rate_limit(args.key, rpm=args.rpm, tpm=args.tpm)
                if args.action == "set"
                else client.set_rate_limit(args.key)
                if args.action == "remove"
                else client.rate_limits()
            )
            print(rates.model_dump_json(indent=2, exclude={"v", "ok"}))
            return 0
        if args.command == "schedule":
            print((await _schedule(client, args)).model_dump_json(indent=2, exclude={"v", "ok"}))
            return 0
        if args.command == "webhooks":
            if args.url or args.clear or args.rotate_secret:
                events = [e.strip() for e in args.events.split(",") if e.strip()]
                endpoints: list[dict[str, Any]] = [
                    {"url": url, "events": events} for url in args.url
                ]
                if args.clear:
                    endpoints = []
                elif not args.url:  # only a new secret: the same endpoints
                    endpoints = [e.model_dump() for e in (await client.webhooks()).endpoints]
                hooks = await client.set_webhooks(endpoints, rotate_secret=args.rotate_secret)
            else:
                hooks = await client.webhooks()
            print(hooks.model_dump_json(indent=2, exclude={"v", "ok"}, exclude_none=True))
            return 0
        if args.command == "policy":
            if args.effects is None:
                policy = await client.policy()
            else:
                kinds = [k.strip() for k in args.effects.split(",") if k.strip()]
                policy = await client.set_policy(
                    effects=None if args.effects.strip().lower() == "any" else kinds
                )
            print(policy.model_dump_json(indent=2, exclude={"v", "ok"}))
            return 0
        if args.command == "top":
            await run_top(
                client.nc,
                tenant=tenant,
                prefix=settings.prefix,
                once=args.once,
                # A tenant's identity may not read the jobs stream: its own runs' view.
                tenant_only=settings.nats_user is not None and is_tenant_user(settings.nats_user),
                budget=client.budget,
            )
            return 0
        if args.command == "cancel":
            run = await client.cancel(args.run_id)
            print(f"run {run.run_id} {run.status}")
            return 0
        if args.command == "reschedule":
            run = await client.reschedule(
                args.run_id, delay_ms=args.delay_ms, not_before=args.not_before
            )
            start = run.not_before.isoformat() if run.not_before else "as soon as it may"
            print(f"run {run.run_id} {run.status}, starts {start}")
            return 0
        if args.command == "list":
            page = await client.list_runs(
                status=args.status,
                runner=args.runner,
                session_id=args.session,
                created_after=args.created_after,
                created_before=args.created_before,
                limit=args.limit,
                before=args.before,
            )
            for run in page.runs:
                print(views.run_line(run))
            if page.next is not None:
                print(f"(more: runwire list --before {page.next} ...)")
            return 0
        if args.command == "resume":
            resumed = await client.resume(
                args.run_id, args.value, wait_id=args.wait_id, request_id=args.request_id
            )
            again = " (the same answer was given before)" if resumed.duplicate else ""
            print(f"run {resumed.run.run_id} {resumed.run.status}{again}")
            return 0
        if args.command == "signal":
            sent = await client.signal(
                args.run_id, args.name, args.payload, request_id=args.request_id
            )
            what = "taken by its wait" if sent.delivered else "kept until it waits for it"
            if sent.duplicate:
                what = "sent before"
            print(f"run {sent.run.run_id} {sent.run.status}: signal {args.name} {what}")
            return 0
        if args.command == "runners":
            return await _runners(client, args.timeout)
        if args.command == "health":
            wait = args.timeout
            if wait is None:
                wait = PROBE_WAIT_S if args.local else HEALTH_WAIT_S
            return await _health(client, args.service, local=args.local, wait=wait)
    return EXIT_USAGE


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `runwire` command."""
    args = _parser().parse_args(argv)
    if args.env is not None:
        os.environ[ENV_FILE_VARIABLE] = str(args.env)
    try:
        handler = getattr(args, "handler", None)
        code = handler(args) if handler is not None else asyncio.run(_main(args))
    except ClientError as exc:
        print(f"runwire: {exc.code}: {exc.message}", file=sys.stderr)
        code = EXIT_FAILED
    except ValueError as exc:
        print(f"runwire: {exc}", file=sys.stderr)
        code = EXIT_USAGE
    except FileNotFoundError as exc:
        print(f"runwire: {exc}", file=sys.stderr)
        code = EXIT_FAILED
    except KeyboardInterrupt:
        code = 130
    raise SystemExit(code)


if __name__ == "__main__":
    main()
