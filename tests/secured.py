"""A nats-server that enforces runwire's identities (infra/auth.py), for the tests that
attack it as a tenant, an outsider or a stolen service identity; or a JetStream cluster
of such servers, where runwire's services connect to one server and the attacker to
another (what it sends crosses the routes)."""

from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NatsClient

from runwire.client import Client
from runwire.contracts.identities import OPERATOR, tenant_user
from runwire.contracts.subjects import Subjects
from runwire.infra.auth import AUTH_FILE, Identities, render
from runwire.infra.embedded import EmbeddedNats, EmbeddedNatsCluster

TENANTS = ("default", "acme", "globex")


class Broker:
    """An authenticating nats-server and the identities it accepts."""

    def __init__(self, folder: Path, prefix: str, servers: int = 1) -> None:
        self.subjects = Subjects(prefix)
        self.identities = Identities.generate()
        for tenant in TENANTS:
            self.identities.add_tenant(tenant)
        # Laid out as a stack's folder (`.runwire/`), so that `runwire tenant` works on it.
        self.folder = folder
        self.auth_file = folder / AUTH_FILE
        self.write()
        self.server: EmbeddedNats | EmbeddedNatsCluster = (
            EmbeddedNatsCluster(folder / "nats", servers, authorization=self.auth_file)
            if servers > 1
            else EmbeddedNats(folder / "nats", authorization=self.auth_file)
        )
        # Every stream on every server of a cluster.
        self.replicas = servers

    @property
    def url(self) -> str:
        """Where tenants and attackers connect: a cluster's last server."""
        if isinstance(self.server, EmbeddedNatsCluster):
            return self.server.nodes[-1].url
        return self.server.url

    @property
    def services_url(self) -> str:
        """Where runwire's services connect: a cluster's first server."""
        if isinstance(self.server, EmbeddedNatsCluster):
            return self.server.nodes[0].url
        return self.server.url

    def write(self) -> None:
        self.auth_file.write_text(render(self.identities, self.subjects))

    async def connect(
        self, user: str | None, *, inbox: str = "_INBOX"
    ) -> tuple[NatsClient, list[str]]:
        """A raw connection as `user`, with the errors the broker sends it."""
        errors: list[str] = []

        async def on_error(exc: Exception) -> None:
            errors.append(str(exc))

        nc = await nats.connect(
            self.url,
            user=user,
            password=self.identities.passwords.get(user or "", None),
            error_cb=on_error,
            inbox_prefix=inbox,
            allow_reconnect=False,
        )
        return nc, errors

    async def consumers_of(self, tenant: str) -> int:
        """How many consumers read `tenant`'s runs' frames (as the operator sees them)."""
        nc, _ = await self.connect(OPERATOR)
        try:
            infos = await nc.jetstream().consumers_info(self.subjects.run_frames_stream)
        finally:
            await nc.close()
        own = f"{self.subjects.prefix}.{tenant}."
        return sum(1 for info in infos if (info.config.filter_subject or "").startswith(own))

    async def tenant(self, tenant: str) -> Client:
        user = tenant_user(tenant)
        return await Client.connect(
            self.url,
            tenant=tenant,
            prefix=self.subjects.prefix,
            user=user,
            password=self.identities.passwords[user],
        )


# A test that runs on one authenticating server and on a cluster of three (the `broker`
# fixture's parameter, given by tests/integration/conftest.py to the tests that use it):
# the attacks must fail across the routes as they fail on one server.
ON_A_CLUSTER = pytest.mark.on_a_cluster
