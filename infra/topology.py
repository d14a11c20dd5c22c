"""What the local stack runs: its nats-servers, each service's replicas (programs under
supervisord) and its gateways.

One of each service on a single server; on a cluster (`make up CLUSTER=3`)
`CLUSTER_REPLICAS` of each, every replica connected first to a server of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from runwire.client.settings import rotated
from runwire.contracts.identities import GATEWAY
from runwire.infra.embedded import EmbeddedNats

# Replicas of every service (and of the gateway) on a clustered stack.
CLUSTER_REPLICAS = 2


@dataclass(frozen=True)
class Replica:
    """One program of a service: its name under supervisord and the NATS URLs it uses
    (on a cluster, a different server first for each replica)."""

    program: str
    service: str
    nats_url: str


def replicas(services: tuple[str, ...], servers: int, nats_urls: list[str]) -> list[Replica]:
    """Every service's programs: one each on a single server; `CLUSTER_REPLICAS` each on
    a cluster, spread over its servers in turn."""
    if servers <= 1:
        return [Replica(service, service, nats_urls[0]) for service in services]
    chosen: list[Replica] = []
    for service in services:
        for i in range(CLUSTER_REPLICAS):
            chosen.append(Replica(f"{service}-{i + 1}", service, rotated(nats_urls, len(chosen))))
    return chosen


@dataclass(frozen=True)
class Topology:
    """What the stack runs: its nats-servers (one, or a cluster's), each service's
    replicas, and the gateways' ports."""

    nats: list[EmbeddedNats]
    replicas: list[Replica]
    gateway_ports: list[int]
    # The authority that signed the servers' certificate, which every client trusts
    # (`RUNWIRE_NATS_TLS_CA`); None: the servers speak plain NATS.
    nats_ca: Path | None = None

    @property
    def clustered(self) -> bool:
        return len(self.nats) > 1

    @property
    def nats_url(self) -> str:
        """Every server's URL, separated by commas (what clients take)."""
        return ",".join(node.url for node in self.nats)

    @property
    def programs(self) -> tuple[str, ...]:
        """The service programs' names, in the order of the services."""
        return tuple(replica.program for replica in self.replicas)

    @property
    def services(self) -> tuple[str, ...]:
        """The services, in their order."""
        return tuple(dict.fromkeys(replica.service for replica in self.replicas))

    def count(self, service: str) -> int:
        """How many replicas of `service` run."""
        return sum(replica.service == service for replica in self.replicas)

    def gateways(self) -> dict[str, int]:
        """supervisord's name of each gateway, and its port."""
        if len(self.gateway_ports) == 1:
            return {GATEWAY: self.gateway_ports[0]}
        return {f"{GATEWAY}-{i + 1}": port for i, port in enumerate(self.gateway_ports)}

    def nats_programs(self) -> dict[str, EmbeddedNats]:
        """supervisord's name of each nats-server."""
        if not self.clustered:
            return {"nats": self.nats[0]}
        return {f"nats-{node.name}": node for node in self.nats}
