"""The local runwire stack: nats-server, Postgres and the four services under supervisord.

Run as `python -m runwire.infra.stack {up,down,logs,status,run}` from the repository root (the
Makefile does). Everything lives in `.runwire/` there (or in `--root`): server data, logs
(the previous start's in `logs/previous/`), the supervisord configuration, the chosen
ports (kept across restarts) and an `env` file with the URLs. `up` returns once every
service answers its health request (`runwire.infra.readiness` waits), so a command sent
right after it is served. supervisord (configured and queried by `runwire.infra.supervisor`)
restarts any process that dies; `down` stops all of them and checks that none is left.

The gateway (runwire's HTTP API) runs beside them on `RUNWIRE_GATEWAY_URL`, accepting
the API keys whose hashes are in `api-keys.json` (the default tenant's key is
`RUNWIRE_API_KEY` in `env`).

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
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import asyncpg
from pydantic import ValidationError

from runwire.client.settings import rotated
from runwire.contracts.identities import GATEWAY, OPERATOR, service_user
from runwire.contracts.subjects import DEFAULT_PREFIX, DEFAULT_TENANT, Subjects
from runwire.gateway.keys import add_key, new_key
from runwire.gateway.settings import DEFAULT_PORT as DEFAULT_GATEWAY_PORT
from runwire.infra.auth import (
    API_KEYS_FILE,
    AUTH_FILE,
    ENV_FILE,
    IDENTITIES_FILE,
    NATS_PID_FILE,
    OPERATOR_ENV_FILE,
    Identities,
    database_url_as,
    read_env_file,
    render,
    service_role,
    tenant_settings,
    write_env_file,
    write_private,
)
from runwire.infra.embedded import EmbeddedNats, EmbeddedNatsCluster
from runwire.infra.postgres import EmbeddedPostgres
from runwire.infra.processes import find_free_port, port_is_free
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
from runwire.infra.supervisor import Program, Supervisor, environment, venv_tool
from runwire.infra.topology import CLUSTER_REPLICAS, Topology, replicas
from runwire.runtime.settings import CommonSettings
from runwire.runtime.store import migrate

SERVICES = ("submitter", "executor", "relay", "recovery")
GATEWAY_HOST = "127.0.0.1"
DATABASE = "runwire"
START_TIMEOUT = 60.0
MAX_PORT = 65535
# `.runwire/env` names each service's metrics endpoint as this + the service, upper-cased.
METRICS_URL = "RUNWIRE_METRICS_URL_"
STOP_TIMEOUT = 60.0
DEMO_TOKENS = ("Hello", ",", " this", " is", " runwire", " streaming", " a", " run", ".")
DEMO_TOKEN_DELAY_MS = 150
# The kernel limits unix socket paths to 108 bytes.
_MAX_SOCKET_PATH = 100


@dataclass(frozen=True)
class Layout:
    """Where the stack keeps its files: `folder`, or `.runwire/` in the repository."""

    repo: Path
    # Another folder for everything the stack writes (a test's own stack, say).
    folder: Path | None = None

    @property
    def root(self) -> Path:
        return self.folder if self.folder is not None else self.repo / ".runwire"

    @property
    def nats_dir(self) -> Path:
        return self.root / "nats"

    @property
    def pg_dir(self) -> Path:
        return self.root / "pg"

    @property
    def nats_pid_file(self) -> Path:
        # Named in the nats-server config that EmbeddedNats writes.
        return self.root / NATS_PID_FILE

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def previous_logs(self) -> Path:
        """The logs of the stack's previous start (`up` sets them aside here)."""
        return self.logs / "previous"

    @property
    def conf(self) -> Path:
        return self.root / "supervisord.conf"

    @property
    def env_file(self) -> Path:
        """The default tenant's client settings (and where the stack is)."""
        return self.root / ENV_FILE

    @property
    def identities_file(self) -> Path:
        """Every identity's secret (infra/auth.py); mode 0600, never committed."""
        return self.root / IDENTITIES_FILE

    @property
    def auth_file(self) -> Path:
        """The nats-server `authorization` block, included by its configuration."""
        return self.root / AUTH_FILE

    @property
    def api_keys_file(self) -> Path:
        """The hashes of the tenants' API keys, which the gateway accepts."""
        return self.root / API_KEYS_FILE

    @property
    def operator_env_file(self) -> Path:
        """The operator's client settings: admin commands, `runwire top`."""
        return self.root / OPERATOR_ENV_FILE

    def service_env_file(self, service: str) -> Path:
        """What a service started by hand next to the stack needs (an extra executor)."""
        return self.root / "services" / f"{service}.env"

    @property
    def shape_file(self) -> Path:
        """How many nats-servers the stack was started with."""
        return self.root / "shape.json"

    @property
    def ports_file(self) -> Path:
        return self.root / "ports.json"

    @property
    def pids_file(self) -> Path:
        return self.root / "pids.json"

    @property
    def supervisord_pid_file(self) -> Path:
        return self.root / "supervisord.pid"

    @property
    def socket(self) -> Path:
        local = self.root / "supervisor.sock"
        if len(str(local)) <= _MAX_SOCKET_PATH:
            return local
        digest = hashlib.sha256(str(self.root).encode()).hexdigest()[:12]
        return Path("/tmp") / f"runwire-{digest}.sock"

    @property
    def supervisor(self) -> Supervisor:
        return Supervisor(conf=self.conf, socket=self.socket)


@dataclass(frozen=True)
class Ports:
    """The loopback ports of the servers and of the gateway (and, on a clustered stack,
    the cluster's servers' ports and the second gateway's)."""

    nats: int
    postgres: int
    gateway: int
    # Per server of a cluster: client ports, then route ports, then monitoring ports.
    cluster: tuple[int, ...] = ()
    gateway_2: int = 0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is dead for our purposes: it holds no port and no file.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def _is_ours(pid: int, layout: Layout) -> bool:
    """Tell whether `pid` is a process this stack started (never trust a recycled pid)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return False
    if str(layout.root) in argv:
        return True
    try:
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return False
    return cwd == layout.repo or layout.repo in cwd.parents


def _supervisord_pid(layout: Layout) -> int | None:
    try:
        pid = int(layout.supervisord_pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    if _pid_alive(pid) and _is_ours(pid, layout):
        return pid
    return None


def _load_ports(layout: Layout, servers: int, gateway_port: int = 0) -> Ports:
    """Reuse the ports of the last start so URLs stay valid; pick new ones if taken (the
    gateway's first choice is `gateway_port` when given, else its default port)."""
    ports = _stored_ports(layout)
    if ports is not None and not (port_is_free(ports.nats) and port_is_free(ports.postgres)):
        _say(f"Ports {ports.nats}/{ports.postgres} are taken by another program; picking new ones.")
        ports = None
    if ports is None:
        nats = find_free_port()
        postgres = find_free_port()
        while postgres == nats:
            postgres = find_free_port()
        ports = Ports(nats=nats, postgres=postgres, gateway=0)
    cluster = ports.cluster
    if servers > 1 and (
        len(cluster) != 3 * servers or not all(port_is_free(port) for port in cluster)
    ):
        cluster = _free_ports(3 * servers, {ports.nats, ports.postgres})
    gateway = gateway_port or ports.gateway
    if not gateway or not port_is_free(gateway):
        gateway = DEFAULT_GATEWAY_PORT if port_is_free(DEFAULT_GATEWAY_PORT) else 0
        while gateway in (0, ports.nats, ports.postgres, *cluster):
            gateway = find_free_port()
    gateway_2 = ports.gateway_2
    if servers > 1 and (not gateway_2 or not port_is_free(gateway_2) or gateway_2 == gateway):
        (gateway_2,) = _free_ports(1, {ports.nats, ports.postgres, gateway, *cluster})
    ports = Ports(ports.nats, ports.postgres, gateway, cluster, gateway_2)
    layout.ports_file.write_text(
        json.dumps(
            {
                "nats": ports.nats,
                "postgres": ports.postgres,
                "gateway": ports.gateway,
                "cluster": list(ports.cluster),
                "gateway_2": ports.gateway_2,
            }
        )
    )
    return ports


def _stored_ports(layout: Layout) -> Ports | None:
    """The ports of the last start, as recorded (a running stack listens on them)."""
    try:
        stored = json.loads(layout.ports_file.read_text())
        return Ports(
            nats=int(stored["nats"]),
            postgres=int(stored["postgres"]),
            gateway=int(stored.get("gateway", 0)),
            cluster=tuple(int(port) for port in stored.get("cluster", ())),
            gateway_2=int(stored.get("gateway_2", 0)),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _free_ports(count: int, avoid: set[int]) -> tuple[int, ...]:
    chosen: list[int] = []
    while len(chosen) < count:
        port = find_free_port()
        if port not in avoid and port not in chosen:
            chosen.append(port)
    return tuple(chosen)


def _cluster(layout: Layout, servers: int, ports: Ports) -> EmbeddedNatsCluster:
    return EmbeddedNatsCluster(
        layout.nats_dir, servers, ports=list(ports.cluster), authorization=layout.auth_file
    )


def metrics_ports(first: int, programs: tuple[str, ...] = SERVICES) -> dict[str, int]:
    """Each service program's `/metrics` port: `first`, `first` + 1, ... in `programs`
    order (none when `first` is 0, as `RUNWIRE_METRICS_PORT` unset means)."""
    if first == 0:
        return {}
    return {program: first + i for i, program in enumerate(programs)}


def _metrics_url(host: str, port: int) -> str:
    # An endpoint on every interface is reached on loopback from here.
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/metrics"


def topology(layout: Layout, servers: int, ports: Ports) -> Topology:
    """The stack's shape for `servers` nats-servers (1: a single server) on `ports`."""
    if servers <= 1:
        nodes = [EmbeddedNats(layout.nats_dir, ports.nats, authorization=layout.auth_file)]
        gateways = [ports.gateway]
    else:
        nodes = _cluster(layout, servers, ports).nodes
        gateways = [ports.gateway, ports.gateway_2]
    urls = [node.url for node in nodes]
    return Topology(nodes, replicas(SERVICES, servers, urls), gateways)


def _programs(
    layout: Layout,
    shape: Topology,
    pg: EmbeddedPostgres,
    database_url: str,
    settings: CommonSettings,
    identities: Identities,
) -> list[Program]:
    """nats-server(s) and Postgres first, then every service replica and the gateways
    wired to them."""
    programs = [
        Program(
            name,
            node.command(),
            node.data_dir,
            {"priority": "10", "stopsignal": "TERM", "stopwaitsecs": "15"},
        )
        for name, node in shape.nats_programs().items()
    ]
    pg_options = {"priority": "10", "stopsignal": "INT", "stopwaitsecs": "30"}
    user = pg.run_as_user()
    if user is not None:
        pg_options["user"] = user
    programs.append(Program("postgres", pg.command(), layout.pg_dir, pg_options))
    wiring = {
        "RUNWIRE_DATABASE_URL": database_url,
        "RUNWIRE_PREFIX": settings.prefix,
        "PYTHONUNBUFFERED": "1",
        # Trace export settings of the shell that starts the stack.
        **{k: v for k, v in os.environ.items() if k.startswith("OTEL_")},
    }
    if shape.clustered:
        wiring["RUNWIRE_STREAM_REPLICAS"] = str(len(shape.nats))
    ports = metrics_ports(settings.metrics_port, shape.programs)
    for replica in shape.replicas:
        # One port each: on the shell's one port, all but the first would crash-loop.
        metrics = {"RUNWIRE_METRICS_PORT": str(ports.get(replica.program, 0))}
        identity = _service_identity(identities, replica.service, database_url)
        nats = {"RUNWIRE_NATS_URL": replica.nats_url}
        programs.append(
            Program(
                replica.program,
                [str(venv_tool("python")), "-m", f"runwire.{replica.service}"],
                layout.repo,
                {
                    "priority": "100",
                    "environment": environment({**wiring, **nats, **metrics, **identity}),
                    # Services wait for NATS and Postgres themselves; a few quick exits
                    # while the servers come up must not mark them FATAL.
                    "startretries": "10",
                    "stopsignal": "TERM",
                    "stopwaitsecs": "20",
                },
            )
        )
    gateway = service_user(GATEWAY)
    urls = [node.url for node in shape.nats]
    for i, (name, port) in enumerate(shape.gateways().items()):
        programs.append(
            Program(
                name,
                [str(venv_tool("python")), "-m", "runwire.gateway"],
                layout.repo,
                {
                    "priority": "100",
                    "environment": environment(
                        {
                            **wiring,
                            "RUNWIRE_NATS_URL": rotated(urls, i),
                            "RUNWIRE_NATS_USER": gateway,
                            "RUNWIRE_NATS_PASSWORD": identities.passwords[gateway],
                            "RUNWIRE_GATEWAY_HOST": GATEWAY_HOST,
                            "RUNWIRE_GATEWAY_PORT": str(port),
                            "RUNWIRE_GATEWAY_KEYS_FILE": str(layout.api_keys_file),
                        }
                    ),
                    "startretries": "10",
                    "stopsignal": "TERM",
                    "stopwaitsecs": "10",
                },
            )
        )
    return programs


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


def _operator(layout: Layout) -> tuple[str | None, str | None]:
    """The operator's identity, for the stack's own health requests."""
    if not layout.identities_file.exists():
        return None, None
    return OPERATOR, Identities.load(layout.identities_file).passwords.get(OPERATOR)


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
    _say(
        f"""
runwire stack is up; every service answers.
  NATS       {nats}
  Postgres   {env["RUNWIRE_DATABASE_URL"]}
{metrics}  gateway    {gateway} (HTTP; key: RUNWIRE_API_KEY)
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


def _read_env(layout: Layout) -> dict[str, str]:
    return read_env_file(layout.env_file)


def _shell_settings() -> CommonSettings | None:
    """The settings every service reads from this shell's `RUNWIRE_*` variables."""
    try:
        return CommonSettings()
    except ValidationError as exc:
        _say(f"A RUNWIRE_* variable of this shell is invalid, so no service would start:\n{exc}")
        return None


def _metrics_ports_free(settings: CommonSettings, programs: tuple[str, ...]) -> bool:
    """Tell whether every service's metrics port is usable; say why not if not."""
    ports = metrics_ports(settings.metrics_port, programs)
    if not ports:
        return True
    first, last = settings.metrics_port, max(ports.values())
    if last > MAX_PORT:
        _say(
            f"RUNWIRE_METRICS_PORT={first} gives the services ports {first}-{last}; "
            f"pick a port up to {MAX_PORT - len(ports) + 1}."
        )
        return False
    taken = [f"{port} ({service})" for service, port in ports.items() if not port_is_free(port)]
    if taken:
        _say(
            f"RUNWIRE_METRICS_PORT={first} gives the services ports {first}-{last}, but "
            f"another program listens on {', '.join(taken)}; pick another port."
        )
        return False
    return True


def _service_identity(identities: Identities, service: str, database_url: str) -> dict[str, str]:
    """A service's identities: on NATS, and in Postgres (its own role)."""
    user = service_user(service)
    return {
        "RUNWIRE_NATS_USER": user,
        "RUNWIRE_NATS_PASSWORD": identities.passwords[user],
        "RUNWIRE_DATABASE_URL": database_url_as(database_url, service_role(service)),
    }


def _identities(layout: Layout, settings: CommonSettings) -> Identities:
    """The stack's identities (made on its first start), with the `default` tenant's,
    and the server's `authorization` block written from them."""
    path = layout.identities_file
    identities = Identities.load(path) if path.exists() else Identities.generate()
    identities.add_tenant(DEFAULT_TENANT)
    write_private(layout.auth_file, render(identities, Subjects(settings.prefix)))
    identities.save(path)  # with the hashes render made
    return identities


def _write_env(
    layout: Layout,
    shape: Topology,
    database_url: str,
    settings: CommonSettings,
    identities: Identities,
) -> dict[str, str]:
    """Write `.runwire/env` (where the stack is, and the default tenant's identity and
    API key, for the CLI and for scripts), the operator's settings and each service's."""
    where = {
        "RUNWIRE_NATS_URL": shape.nats_url,
        "RUNWIRE_DATABASE_URL": database_url,
        "RUNWIRE_PREFIX": settings.prefix,
    }
    # The default tenant's API key: the one it had, else a new one (its hash is what the
    # gateway keeps).
    key = read_env_file(layout.env_file).get("RUNWIRE_API_KEY") or new_key()
    add_key(layout.api_keys_file, DEFAULT_TENANT, key)
    env = {
        **where,
        **tenant_settings(identities, DEFAULT_TENANT),
        "RUNWIRE_GATEWAY_URL": f"http://{GATEWAY_HOST}:{shape.gateway_ports[0]}",
        "RUNWIRE_API_KEY": key,
    }
    if shape.clustered:
        env["RUNWIRE_GATEWAY_URLS"] = ",".join(
            f"http://{GATEWAY_HOST}:{port}" for port in shape.gateway_ports
        )
    for program, port in metrics_ports(settings.metrics_port, shape.programs).items():
        name = program.upper().replace("-", "_")
        env[f"{METRICS_URL}{name}"] = _metrics_url(settings.metrics_host, port)
    write_env_file(layout.env_file, env)
    operator = {
        "RUNWIRE_NATS_USER": OPERATOR,
        "RUNWIRE_NATS_PASSWORD": identities.passwords[OPERATOR],
    }
    write_env_file(
        layout.operator_env_file, {**where, "RUNWIRE_TENANT": DEFAULT_TENANT, **operator}
    )
    # A service started by hand beside a clustered stack declares its streams alike.
    streams = {"RUNWIRE_STREAM_REPLICAS": str(len(shape.nats))} if shape.clustered else {}
    for service in SERVICES:
        write_env_file(
            layout.service_env_file(service),
            {**where, **streams, **_service_identity(identities, service, database_url)},
        )
    return env


def up(layout: Layout, start_timeout: float = START_TIMEOUT, servers: int | None = None) -> int:
    """Start the stack unless it runs (with `servers` nats-servers in a cluster when more
    than 1; None: as it runs, else one); return once every service answers its health
    request (or exit 1 after `start_timeout` seconds, naming those that did not; 2 as
    soon as one refuses its configuration, saying why). The logs of the previous start
    are set aside in `logs/previous/`."""
    if _supervisord_pid(layout) is not None:
        running = _stored_servers(layout)
        if servers is not None and running != servers:
            _say(
                f"runwire stack is already running with {_servers(running)}, not "
                f"{_servers(servers)}: `make down` first."
            )
            return 1
        _say("runwire stack is already running.")
        ports = _stored_ports(layout)
        if ports is None:
            _say(f"{layout.ports_file} is missing or unreadable: `make down`, then `make up`.")
            return 1
        shape = topology(layout, running, ports)
        return _wait_for_services(layout, shape, _read_env(layout), start_timeout)
    servers = servers or 1
    settings = _shell_settings()
    if settings is None:
        return 1
    if _known_pids(layout):
        # supervisord died but its programs did not; they would hold the ports and folders.
        down(layout)
    for folder in (layout.root, layout.logs, layout.nats_dir):
        folder.mkdir(parents=True, exist_ok=True)
    _set_aside_logs(layout)
    wanted = settings_port()
    if wanted and not port_is_free(wanted):
        _say(f"RUNWIRE_GATEWAY_PORT={wanted} is taken by another program; pick another port.")
        return 1
    ports = _load_ports(layout, servers, wanted)
    shape = topology(layout, servers, ports)
    if not _metrics_ports_free(settings, shape.programs):
        return 1
    _store_servers(layout, servers)
    identities = _identities(layout, settings)
    pg = EmbeddedPostgres(layout.pg_dir, ports.postgres)
    if not (layout.pg_dir / "PG_VERSION").exists():
        _say(f"Creating the Postgres cluster in {layout.pg_dir} ...")
    pg.init()
    database_url = pg.url(DATABASE)
    layout.supervisor.write_config(
        logs=layout.logs,
        pid_file=layout.supervisord_pid_file,
        directory=layout.repo,
        programs=_programs(layout, shape, pg, database_url, settings, identities),
    )
    env = _write_env(layout, shape, database_url, settings, identities)

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


def settings_port() -> int:
    """The gateway's port that the shell asks for (`RUNWIRE_GATEWAY_PORT`), or 0."""
    try:
        return int(os.environ.get("RUNWIRE_GATEWAY_PORT", "0"))
    except ValueError:
        return 0


def _servers(count: int) -> str:
    return "one nats-server" if count <= 1 else f"a cluster of {count} nats-servers"


def _stored_servers(layout: Layout) -> int:
    """How many nats-servers the running stack was started with."""
    try:
        return int(json.loads(layout.shape_file.read_text())["servers"])
    except (OSError, ValueError, KeyError, TypeError):
        return 1


def _store_servers(layout: Layout, servers: int) -> None:
    layout.shape_file.write_text(json.dumps({"servers": servers}))


def _wait_for_services(layout: Layout, shape: Topology, env: dict[str, str], timeout: float) -> int:
    """Wait until every service answers its health request, then say where things are."""
    _say("Waiting for every service to answer its health request ...")
    prefix = env.get("RUNWIRE_PREFIX", DEFAULT_PREFIX)
    supervisor, logs = layout.supervisor, layout.logs
    not_up = asyncio.run(unanswered(supervisor, logs, shape, prefix, _operator(layout), timeout))
    for name, port in shape.gateways().items():
        if not_up is not None:
            break
        url = f"http://{GATEWAY_HOST}:{port}"
        not_up = gateway_unanswered(supervisor, logs, name, url, timeout)
    if not_up is not None:
        return _failed(layout, not_up)
    _record_pids(layout)
    _summary(layout, shape, env)
    return 0


def _failed(layout: Layout, not_up: NotUp) -> int:
    """Say why the stack is not up; the exit status of `up`."""
    _record_pids(layout)
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


def _record_pids(layout: Layout) -> None:
    """Remember our pids so `down` can clean up even if supervisord itself died."""
    pids = layout.supervisor.program_pids()
    supervisord = _supervisord_pid(layout)
    if supervisord is not None:
        pids["supervisord"] = supervisord
    layout.pids_file.write_text(json.dumps(pids))


def _known_pids(layout: Layout) -> set[int]:
    pids: set[int] = set()
    try:
        recorded = json.loads(layout.pids_file.read_text())
        pids.update(int(pid) for pid in recorded.values())
    except (OSError, ValueError, AttributeError, TypeError):
        pass  # nothing recorded: only what is alive now counts
    # The servers' own pid files are missing or stale when they are not running.
    postmaster = layout.pg_dir / "postmaster.pid"
    with contextlib.suppress(OSError, ValueError, IndexError):
        pids.add(int(postmaster.read_text().split()[0]))
    for pid_file in (layout.nats_pid_file, *layout.nats_dir.glob("n*/nats-server.pid")):
        with contextlib.suppress(OSError, ValueError):
            pids.add(int(pid_file.read_text().strip()))
    return {pid for pid in pids if _pid_alive(pid) and _is_ours(pid, layout)}


def down(layout: Layout) -> int:
    """Stop supervisord and every process of the stack; wait until all are gone."""
    supervisord = _supervisord_pid(layout)
    if supervisord is not None:
        leftovers = (
            _known_pids(layout) | set(layout.supervisor.program_pids().values()) | {supervisord}
        )
        _say("Stopping the runwire stack ...")
        layout.supervisor.ctl("shutdown")
    else:
        leftovers = _known_pids(layout)
        if not leftovers:
            _say("runwire stack is not running.")
            return 0
        _say("supervisord is gone; stopping what it left behind ...")
        for pid in leftovers:
            _signal(pid, signal.SIGTERM)
    start = time.monotonic()
    last_report = start
    while time.monotonic() - start < STOP_TIMEOUT:
        leftovers = {pid for pid in leftovers if _pid_alive(pid)}
        if not leftovers:
            break
        if time.monotonic() - last_report >= PROGRESS_REPEAT:
            waiting = ", ".join(_describe(pid) for pid in sorted(leftovers))
            _say(f"  ... still stopping ({time.monotonic() - start:.0f} s): {waiting}")
            last_report = time.monotonic()
        time.sleep(POLL_S)
    for pid in leftovers:
        if _is_ours(pid, layout):
            _say(f"  killing leftover process {pid}")
            _signal(pid, signal.SIGKILL)
    layout.pids_file.unlink(missing_ok=True)
    _say("runwire stack is stopped.")
    return 0


def _describe(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return str(pid)
    words = [Path(argv[0].decode()).name] + [arg.decode() for arg in argv[1:3] if arg]
    return f"{pid} ({' '.join(words)})"


def _signal(pid: int, sig: signal.Signals) -> None:
    # It may have exited on its own meanwhile.
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


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
    if _supervisord_pid(layout) is None:
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
    env = {**os.environ, **_read_env(layout)}
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
