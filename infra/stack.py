"""The local runwire stack: nats-server, Postgres and the four services under supervisord.

Run as `python -m runwire.infra.stack {up,down,logs,status,run}` from the repository root (the
Makefile does). Everything lives in `.runwire/` there (or in `--root`; `runwire.infra.layout`
names each file): server data, logs (the previous start's in `logs/previous/`), the
supervisord configuration, the chosen ports (kept across restarts, `runwire.infra.ports`),
a certificate authority of the stack's own and its nats-servers' certificate (kept
across restarts, `runwire.infra.certificates`: the servers require TLS) and an `env` file
with the URLs and that authority (`runwire.infra.settings_files`). `up` returns once every
service answers its health request (`runwire.infra.readiness` waits), so a command sent
right after it is served. supervisord (configured and queried by `runwire.infra.supervisor`,
running what `runwire.infra.programs` lists) restarts any process that dies; `down` stops
all of them and checks that none is left (`runwire.infra.pids` knows which are ours).

The gateway (runwire's HTTP API) runs beside them on `RUNWIRE_GATEWAY_URL`, accepting
the API keys whose hashes are in `api-keys.json` (the default tenant's key is
`RUNWIRE_API_KEY` in `env`): plain HTTP on loopback, unless the shell gives it a
certificate (`RUNWIRE_GATEWAY_TLS_CERT`, `RUNWIRE_GATEWAY_TLS_KEY`).

`up --cluster 3` starts a clustered stack instead: three nats-servers routed into one
JetStream cluster, every stream at three replicas, and two replicas of every service and
of the gateway, each replica connected first to a different server of the cluster.

The services read the `RUNWIRE_*` settings of the shell that runs `up`, with two
exceptions made here: the URLs of the stack's own servers, and `RUNWIRE_METRICS_PORT`,
which is the first of consecutive ports, one per service replica in `SERVICES` order.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg

from runwire.contracts.identities import SERVICES
from runwire.contracts.subjects import DEFAULT_PREFIX
from runwire.infra.auth import service_role
from runwire.infra.certificates import ensure as ensure_certificates
from runwire.infra.embedded import EmbeddedNats, EmbeddedNatsCluster, RouteTls
from runwire.infra.layout import Layout
from runwire.infra.pids import (
    describe,
    is_ours,
    known_pids,
    pid_alive,
    record_pids,
    send_signal,
    supervisord_pid,
)
from runwire.infra.ports import (
    Ports,
    gateway_url,
    load_ports,
    metrics_ports_free,
    settings_port,
    store_servers,
    stored_ports,
    stored_servers,
)
from runwire.infra.postgres import EmbeddedPostgres
from runwire.infra.processes import port_is_free
from runwire.infra.programs import stack_programs
from runwire.infra.readiness import (
    POLL_S,
    PROGRESS_REPEAT,
    NotUp,
    gateway_unanswered,
    tail,
    unanswered,
    wait,
)
from runwire.infra.readiness import say as _say
from runwire.infra.settings_files import (
    METRICS_URL,
    operator_identity,
    read_env,
    shell_settings,
    stack_identities,
    write_env,
)
from runwire.infra.supervisor import venv_tool
from runwire.infra.topology import CLUSTER_REPLICAS, Topology, replicas
from runwire.runtime.store import migrate

DATABASE = "runwire"
START_TIMEOUT = 60.0
STOP_TIMEOUT = 60.0
DEMO_TOKENS = ("Hello", ",", " this", " is", " runwire", " streaming", " a", " run", ".")
DEMO_TOKEN_DELAY_MS = 150


def _cluster(layout: Layout, servers: int, ports: Ports) -> EmbeddedNatsCluster:
    tls = layout.certificates
    return EmbeddedNatsCluster(
        layout.nats_dir,
        servers,
        ports=list(ports.cluster),
        authorization=layout.auth_file,
        tls=(tls.cert, tls.key),
        # The servers show each other the same certificate on their routes.
        route_tls=RouteTls(tls.cert, tls.key, tls.ca),
    )


def topology(layout: Layout, servers: int, ports: Ports) -> Topology:
    """The stack's shape for `servers` nats-servers (1: a single server) on `ports`, each
    requiring TLS with the certificate in `layout.certificates`."""
    tls = layout.certificates
    if servers <= 1:
        nodes = [
            EmbeddedNats(
                layout.nats_dir,
                ports.nats,
                authorization=layout.auth_file,
                tls=(tls.cert, tls.key),
            )
        ]
        gateways = [ports.gateway]
    else:
        nodes = _cluster(layout, servers, ports).nodes
        gateways = [ports.gateway, ports.gateway_2]
    urls = [node.url for node in nodes]
    return Topology(nodes, replicas(SERVICES, servers, urls), gateways, tls.ca)


async def _prepare_database(database_url: str) -> None:
    """Apply the migrations, and let the services' roles log in (the server trusts
    loopback connections: no password)."""
    await migrate(database_url)
    conn = await asyncpg.connect(database_url)
    try:
        for service in SERVICES:
            await conn.execute(f"ALTER ROLE {service_role(service)} LOGIN")
    finally:
        await conn.close()


async def _ensure_database(admin_url: str, name: str) -> None:
    conn = await asyncpg.connect(admin_url)
    try:
        exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name)
        if not exists:
            # Created concurrently is as good as created by us.
            with contextlib.suppress(asyncpg.DuplicateDatabaseError):
                await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()


def _summary(layout: Layout, shape: Topology, env: dict[str, str]) -> None:
    runwire = venv_tool("runwire")
    metrics = "".join(
        f"  metrics    {env[key]} ({program})\n"
        for program in shape.programs
        if (key := f"{METRICS_URL}{program.upper().replace('-', '_')}") in env
    )
    nats = (
        env["RUNWIRE_NATS_URL"]
        if not shape.clustered
        else f"{env['RUNWIRE_NATS_URL']}\n"
        f"             (a JetStream cluster of {len(shape.nats)}, streams at "
        f"{len(shape.nats)} replicas; {CLUSTER_REPLICAS} replicas of every service)"
    )
    gateway = env.get("RUNWIRE_GATEWAY_URLS") or env.get("RUNWIRE_GATEWAY_URL", "(none)")
    http = urlsplit(gateway).scheme.upper() or "HTTP"
    if "RUNWIRE_NATS_TLS_CA" in env:
        nats += f"\n             (TLS only; clients trust {env['RUNWIRE_NATS_TLS_CA']})"
    _say(
        f"""
runwire stack is up; every service answers.
  NATS       {nats}
  Postgres   {env["RUNWIRE_DATABASE_URL"]}
{metrics}  gateway    {gateway} ({http}; key: RUNWIRE_API_KEY)
  env file   {layout.env_file} (the default tenant's)
  operator   {layout.operator_env_file} (admin commands: runwire --env FILE budget ...)

Stream a run:
  set -a; . {layout.env_file}; set +a
  {runwire} submit --tokens "Hello" " world" --watch
Add a tenant (its own NATS identity):
  {runwire} tenant add acme

Follow logs: make logs    Status: make status    Stop everything: make down
"""
    )


def up(layout: Layout, start_timeout: float = START_TIMEOUT, servers: int | None = None) -> int:
    """Start the stack unless it runs (with `servers` nats-servers in a cluster when more
    than 1; None: as it runs, else one); return once every service answers its health
    request (or exit 1 after `start_timeout` seconds, naming those that did not; 2 as
    soon as one refuses its configuration, saying why). The logs of the previous start
    are set aside in `logs/previous/`."""
    if supervisord_pid(layout) is not None:
        running = stored_servers(layout)
        if servers is not None and running != servers:
            _say(
                f"runwire stack is already running with {_servers(running)}, not "
                f"{_servers(servers)}: `make down` first."
            )
            return 1
        _say("runwire stack is already running.")
        ports = stored_ports(layout)
        if ports is None:
            _say(f"{layout.ports_file} is missing or unreadable: `make down`, then `make up`.")
            return 1
        shape = topology(layout, running, ports)
        return _wait_for_services(layout, shape, read_env(layout), start_timeout)
    servers = servers or 1
    settings = shell_settings()
    if settings is None:
        return 1
    if known_pids(layout):
        # supervisord died but its programs did not; they would hold the ports and folders.
        down(layout)
    for folder in (layout.root, layout.logs, layout.nats_dir):
        folder.mkdir(parents=True, exist_ok=True)
    _set_aside_logs(layout)
    for made in ensure_certificates(layout.certificates):
        _say(f"Made {made}.")
    wanted = settings_port()
    if wanted and not port_is_free(wanted):
        _say(f"RUNWIRE_GATEWAY_PORT={wanted} is taken by another program; pick another port.")
        return 1
    ports = load_ports(layout, servers, wanted)
    shape = topology(layout, servers, ports)
    if not metrics_ports_free(settings, shape.programs):
        return 1
    store_servers(layout, servers)
    identities = stack_identities(layout, settings)
    pg = EmbeddedPostgres(layout.pg_dir, ports.postgres)
    if not (layout.pg_dir / "PG_VERSION").exists():
        _say(f"Creating the Postgres cluster in {layout.pg_dir} ...")
    pg.init()
    database_url = pg.url(DATABASE)
    layout.supervisor.write_config(
        logs=layout.logs,
        pid_file=layout.supervisord_pid_file,
        directory=layout.repo,
        programs=stack_programs(layout, shape, pg, database_url, settings, identities),
    )
    env = write_env(layout, shape, database_url, settings, identities)

    _say("Starting supervisord ...")
    started = layout.supervisor.start()
    if started.returncode != 0:
        _say(f"supervisord failed to start:\n{started.stdout}{started.stderr}")
        return 1

    what = "nats-server" if not shape.clustered else f"the NATS cluster of {len(shape.nats)}"
    _say(f"Waiting for {what} ({shape.nats_url}) and Postgres (port {ports.postgres}) ...")
    nats_ready = _cluster(layout, servers, ports).ready if shape.clustered else shape.nats[0].ready
    checks = {**dict.fromkeys(shape.nats_programs(), nats_ready), "postgres": pg.ready}

    def server_states() -> str:
        states = layout.supervisor.states()
        return ", ".join(f"{name} {states.get(name, '?')}" for name in checks)

    servers_up = wait(
        f"{what} and Postgres",
        lambda: all(ready() for ready in set(checks.values())),
        server_states,
        start_timeout,
    )
    if not servers_up:
        states = layout.supervisor.states()
        problems = {
            name: f"{states.get(name, 'unknown')}, does not accept connections"
            for name, ready in checks.items()
            if not ready()
        }
        what = f"{', '.join(problems)} did not accept connections within {start_timeout:g} s"
        return _failed(layout, NotUp(what, problems, True))
    asyncio.run(_ensure_database(pg.url(), DATABASE))
    # As the owner: the services connect as their own roles, which may not migrate.
    asyncio.run(_prepare_database(database_url))
    _say(f"Database {DATABASE!r} is ready.")
    return _wait_for_services(layout, shape, env, start_timeout)


def _servers(count: int) -> str:
    return "one nats-server" if count <= 1 else f"a cluster of {count} nats-servers"


def _wait_for_services(layout: Layout, shape: Topology, env: dict[str, str], timeout: float) -> int:
    """Wait until every service answers its health request, then say where things are."""
    _say("Waiting for every service to answer its health request ...")
    prefix = env.get("RUNWIRE_PREFIX", DEFAULT_PREFIX)
    supervisor, logs = layout.supervisor, layout.logs
    operator = operator_identity(layout)
    not_up = asyncio.run(unanswered(supervisor, logs, shape, prefix, operator, timeout))
    # HTTPS when the shell that started the stack gave the gateway a certificate.
    scheme = urlsplit(env.get("RUNWIRE_GATEWAY_URL", "")).scheme or "http"
    for name, port in shape.gateways().items():
        if not_up is not None:
            break
        url = gateway_url(port, scheme)
        not_up = gateway_unanswered(supervisor, logs, name, url, timeout)
    if not_up is not None:
        return _failed(layout, not_up)
    record_pids(layout)
    _summary(layout, shape, env)
    return 0


def _failed(layout: Layout, not_up: NotUp) -> int:
    """Say why the stack is not up; the exit status of `up`."""
    record_pids(layout)
    _say(f"\nThe stack did not come up: {not_up.what}.")
    for name, problem in not_up.problems.items():
        log = layout.logs / f"{name}.log"
        _say(f"  {name}: {problem}; last lines of {log}:\n{tail(log)}")
    if not_up.refused:
        # Its settings are written into supervisord's configuration when the stack starts.
        _say("\nFix that, then `make down` and `make up` (`make up` alone keeps what was started).")
        return not_up.code
    _say("\nEverything started so far is still up: `make logs` to look, `make down` to stop.")
    if not_up.timed_out:
        _say("On a slow machine, wait longer: `make up START_TIMEOUT=120`.")
    return not_up.code


def _set_aside_logs(layout: Layout) -> None:
    """Move the logs of the previous start to `logs/previous/` (in place of the start's
    before), so that the logs of this start, which `make logs` follows, are its own."""
    files = [path for path in layout.logs.iterdir() if path.is_file()]
    if not files:
        return
    if layout.previous_logs.exists():
        shutil.rmtree(layout.previous_logs)
    layout.previous_logs.mkdir()
    for path in files:
        path.replace(layout.previous_logs / path.name)


def down(layout: Layout) -> int:
    """Stop supervisord and every process of the stack; wait until all are gone."""
    supervisord = supervisord_pid(layout)
    if supervisord is not None:
        leftovers = (
            known_pids(layout) | set(layout.supervisor.program_pids().values()) | {supervisord}
        )
        _say("Stopping the runwire stack ...")
        layout.supervisor.ctl("shutdown")
    else:
        leftovers = known_pids(layout)
        if not leftovers:
            _say("runwire stack is not running.")
            return 0
        _say("supervisord is gone; stopping what it left behind ...")
        for pid in leftovers:
            send_signal(pid, signal.SIGTERM)
    start = time.monotonic()
    last_report = start
    while time.monotonic() - start < STOP_TIMEOUT:
        leftovers = {pid for pid in leftovers if pid_alive(pid)}
        if not leftovers:
            break
        if time.monotonic() - last_report >= PROGRESS_REPEAT:
            waiting = ", ".join(describe(pid) for pid in sorted(leftovers))
            _say(f"  ... still stopping ({time.monotonic() - start:.0f} s): {waiting}")
            last_report = time.monotonic()
        time.sleep(POLL_S)
    for pid in leftovers:
        if is_ours(pid, layout):
            _say(f"  killing leftover process {pid}")
            send_signal(pid, signal.SIGKILL)
    layout.pids_file.unlink(missing_ok=True)
    _say("runwire stack is stopped.")
    return 0


def logs(layout: Layout) -> int:
    """Follow every log of the stack's last start (replaces this process with `tail -F`)."""
    files = sorted(str(path) for path in layout.logs.glob("*.log"))
    if not files:
        _say("No logs yet; start the stack with `make up`.")
        return 1
    if layout.previous_logs.exists():
        _say(f"(The logs of the start before are in {layout.previous_logs}.)")
    os.execvp("tail", ["tail", "-n", "20", "-F", *files])


def status(layout: Layout) -> int:
    """Print supervisord's view of every program."""
    if supervisord_pid(layout) is None:
        _say("runwire stack is not running.")
        return 0
    done = layout.supervisor.ctl("status")
    print(done.stdout, end="", flush=True)
    return done.returncode


def run(layout: Layout, start_timeout: float = START_TIMEOUT, servers: int | None = None) -> int:
    """Bring the stack up, stream a demo run, keep the stack up until SIGINT/SIGTERM."""
    code = up(layout, start_timeout, servers)
    if code != 0:
        return code
    demo = [
        str(venv_tool("runwire")),
        "submit",
        "--tokens",
        *DEMO_TOKENS,
        "--token-delay-ms",
        str(DEMO_TOKEN_DELAY_MS),
        "--watch",
    ]
    # Block the stop signals before anything else, so a Ctrl-C during the demo is
    # queued for sigwait below instead of interrupting the wait for a clean shutdown.
    stop_signals = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    env = {**os.environ, **read_env(layout)}
    try:
        demo_run = subprocess.run(demo, env=env, check=False, preexec_fn=_unblock(stop_signals))
    except OSError as exc:
        _say(f"Could not run the demo ({shlex.join(demo)}): {exc}")
    else:
        if demo_run.returncode != 0:
            _say(f"The demo run failed (exit status {demo_run.returncode}): {shlex.join(demo)}")
    _say("\nThe stack stays up; press Ctrl-C to stop it.")
    signal.sigwait(stop_signals)
    _say("")
    return down(layout)


def _unblock(signals: set[signal.Signals]) -> Callable[[], None]:
    # Children inherit the blocked mask across exec; the demo CLI must still see Ctrl-C.
    def hook() -> None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)

    return hook


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m runwire.infra.stack",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", choices=("up", "down", "logs", "status", "run"))
    parser.add_argument(
        "--root",
        type=Path,
        help="folder for everything the stack writes (default: .runwire/ in this folder)",
    )
    parser.add_argument(
        "--start-timeout",
        type=float,
        default=START_TIMEOUT,
        metavar="SECONDS",
        help=f"how long `up` waits for the servers, then for the services (default "
        f"{START_TIMEOUT:g})",
    )
    parser.add_argument(
        "--cluster",
        type=int,
        default=None,
        metavar="SERVERS",
        help="`up` and `run`: a JetStream cluster of SERVERS nats-servers (3 or 5), every "
        f"stream replicated on each, {CLUSTER_REPLICAS} replicas of every service "
        "(default: as the stack runs, else one nats-server and one of each)",
    )
    args = parser.parse_args(argv)
    if args.cluster not in (None, 0, 1, 3, 5):
        parser.error("--cluster takes 3 or 5 servers (a JetStream cluster needs a majority)")
    servers = None if args.cluster is None else max(args.cluster, 1)
    root = None if args.root is None else args.root.absolute()
    layout = Layout(repo=Path.cwd().absolute(), folder=root)
    commands: dict[str, Callable[[Layout], int]] = {
        "up": lambda layout: up(layout, args.start_timeout, servers),
        "down": down,
        "logs": logs,
        "status": status,
        "run": lambda layout: run(layout, args.start_timeout, servers),
    }
    return commands[args.command](layout)


if __name__ == "__main__":
    sys.exit(main())
