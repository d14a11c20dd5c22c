"""A nats-server that enforces runwire's identities (infra/auth.py), for the tests that
attack it as a tenant, an outsider or a stolen service identity."""

from pathlib import Path

import nats
from nats.aio.client import Client as NatsClient

from runwire.client import Client
from runwire.contracts.identities import tenant_user
from runwire.contracts.subjects import Subjects
from runwire.infra.auth import AUTH_FILE, Identities, render
from runwire.infra.embedded import EmbeddedNats

TENANTS = ("default", "acme", "globex")


class Broker:
    """An authenticating nats-server and the identities it accepts."""

    def __init__(self, folder: Path, prefix: str) -> None:
        self.subjects = Subjects(prefix)
        self.identities = Identities.generate()
        for tenant in TENANTS:
            self.identities.add_tenant(tenant)
        # Laid out as a stack's folder (`.runwire/`), so that `runwire tenant` works on it.
        self.folder = folder
        self.auth_file = folder / AUTH_FILE
        self.write()
        self.server = EmbeddedNats(folder / "nats", authorization=self.auth_file)

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
            self.server.url,
            user=user,
            password=self.identities.passwords.get(user or "", None),
            error_cb=on_error,
            inbox_prefix=inbox,
            allow_reconnect=False,
        )
        return nc, errors

    async def tenant(self, tenant: str) -> Client:
        user = tenant_user(tenant)
        return await Client.connect(
            self.server.url,
            tenant=tenant,
            prefix=self.subjects.prefix,
            user=user,
            password=self.identities.passwords[user],
        )
