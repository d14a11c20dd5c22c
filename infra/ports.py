"""The loopback ports of a local stack: its servers' and its gateways', chosen on the
first start and kept in `ports.json` so that the URLs in `env` stay valid across restarts;
the services' metrics ports, consecutive from `RUNWIRE_METRICS_PORT`; and how many
nats-servers the stack was started with (`shape.json`), which a later `up` keeps.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from runwire.contracts.identities import SERVICES
from runwire.gateway.settings import DEFAULT_PORT as DEFAULT_GATEWAY_PORT
from runwire.infra.layout import Layout
from runwire.infra.processes import find_free_port, port_is_free
from runwire.infra.readiness import say
from runwire.runtime.settings import CommonSettings

# Where the gateways listen.
GATEWAY_HOST = "127.0.0.1"
MAX_PORT = 65535


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


def load_ports(layout: Layout, servers: int, gateway_port: int = 0) -> Ports:
    """Reuse the ports of the last start so URLs stay valid; pick new ones if taken (the
    gateway's first choice is `gateway_port` when given, else its default port)."""
    ports = stored_ports(layout)
    # The gateway's port asked for is not bound yet: no server may be given it.
    asked = {gateway_port} if gateway_port else set()
    if ports is not None and not (port_is_free(ports.nats) and port_is_free(ports.postgres)):
        say(f"Ports {ports.nats}/{ports.postgres} are taken by another program; picking new ones.")
        ports = None
    if ports is not None and asked & {ports.nats, ports.postgres}:
        say(f"The gateway's port {gateway_port} was a server's; picking new server ports.")
        ports = None
    if ports is None:
        nats, postgres = _free_ports(2, asked)
        ports = Ports(nats=nats, postgres=postgres, gateway=0)
    cluster = ports.cluster
    if servers > 1 and (
        len(cluster) != 3 * servers
        or not all(port_is_free(port) for port in cluster)
        or asked & set(cluster)
    ):
        cluster = _free_ports(3 * servers, {ports.nats, ports.postgres, *asked})
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


def stored_ports(layout: Layout) -> Ports | None:
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


def gateway_url(port: int, scheme: str = "http") -> str:
    """Where a gateway of the stack answers: plain HTTP, unless the shell that started
    the stack gave it a certificate (`https`)."""
    return f"{scheme}://{GATEWAY_HOST}:{port}"


def settings_port() -> int:
    """The gateway's port that the shell asks for (`RUNWIRE_GATEWAY_PORT`), or 0."""
    try:
        return int(os.environ.get("RUNWIRE_GATEWAY_PORT", "0"))
    except ValueError:
        return 0


def metrics_ports(first: int, programs: tuple[str, ...] = SERVICES) -> dict[str, int]:
    """Each service program's `/metrics` port: `first`, `first` + 1, ... in `programs`
    order (none when `first` is 0, as `RUNWIRE_METRICS_PORT` unset means)."""
    if first == 0:
        return {}
    return {program: first + i for i, program in enumerate(programs)}


def metrics_url(host: str, port: int) -> str:
    """The URL of the `/metrics` endpoint a service serves on `host` and `port`."""
    # An endpoint on every interface is reached on loopback from here.
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/metrics"


def metrics_ports_free(settings: CommonSettings, programs: tuple[str, ...]) -> bool:
    """Tell whether every service's metrics port is usable; say why not if not."""
    ports = metrics_ports(settings.metrics_port, programs)
    if not ports:
        return True
    first, last = settings.metrics_port, max(ports.values())
    if last > MAX_PORT:
        say(
            f"RUNWIRE_METRICS_PORT={first} gives the services ports {first}-{last}; "
            f"pick a port up to {MAX_PORT - len(ports) + 1}."
        )
        return False
    taken = [f"{port} ({service})" for service, port in ports.items() if not port_is_free(port)]
    if taken:
        say(
            f"RUNWIRE_METRICS_PORT={first} gives the services ports {first}-{last}, but "
            f"another program listens on {', '.join(taken)}; pick another port."
        )
        return False
    return True


def stored_servers(layout: Layout) -> int:
    """How many nats-servers the running stack was started with."""
    try:
        return int(json.loads(layout.shape_file.read_text())["servers"])
    except (OSError, ValueError, KeyError, TypeError):
        return 1


def store_servers(layout: Layout, servers: int) -> None:
    """Record how many nats-servers the stack is started with."""
    layout.shape_file.write_text(json.dumps({"servers": servers}))
