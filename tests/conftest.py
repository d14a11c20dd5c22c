"""Fixtures every tier shares: real servers, a database per test, a subject prefix per test.

Servers are started once per test process (each pytest-xdist worker has its own when the
provider starts them). Every test gets a fresh database copied from a migrated template
and a subject prefix of its own, so tests never see each other's runs and can run in
parallel.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import asyncpg
import pytest

from runwire.runtime.store import migrate
from tests.infra import choose_provider, provide
from tests.traces import InProcessSpans

TEMPLATE = "rw_template"


@dataclass(frozen=True)
class TestInfra:
    """The servers of this test session and the migrated template database."""

    __test__ = False  # a fixture value, not a test class

    nats_url: str
    admin_url: str
    template: str
    provider: str

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


async def _build_template(infra: TestInfra) -> None:
    conn = await asyncpg.connect(infra.admin_url)
    try:
        # A template left by an earlier session may predate the current migrations.
        await conn.execute(f'DROP DATABASE IF EXISTS "{infra.template}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{infra.template}"')
    finally:
        await conn.close()
    await migrate(infra.database_url(infra.template))


@pytest.fixture(scope="session")
def infra() -> Iterator[TestInfra]:
    """nats-server and Postgres for this test process, with the template database ready."""
    provider = choose_provider()
    template = TEMPLATE
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if provider == "external" and worker:
        # Workers share an external server; each rebuilds a template of its own.
        template = f"{TEMPLATE}_{worker}"
    with provide(provider) as endpoints:
        session = TestInfra(endpoints.nats_url, endpoints.admin_url, template, provider)
        asyncio.run(_build_template(session))
        yield session
        # Matters on a shared external server; a throwaway one goes away anyway.
        asyncio.run(session.drop_database(template))


@pytest.fixture
async def db_url(infra: TestInfra) -> AsyncIterator[str]:
    """URL of a fresh, migrated database of this test's own, dropped afterwards."""
    name = f"t_{secrets.token_hex(6)}"
    url = await infra.create_database(name)
    yield url
    await infra.drop_database(name)


@pytest.fixture
def prefix() -> str:
    """A subject prefix of this test's own (services use it in place of `rw`)."""
    return f"t{secrets.token_hex(4)}"


@pytest.fixture
def service_env(infra: TestInfra, db_url: str, prefix: str) -> dict[str, str]:
    """Environment for a service subprocess wired to this test's database and prefix."""
    return {
        **os.environ,
        "RUNWIRE_NATS_URL": infra.nats_url,
        "RUNWIRE_DATABASE_URL": db_url,
        "RUNWIRE_PREFIX": prefix,
    }


_SPANS = InProcessSpans()
_SPANS.install()  # the tracer provider of this test process (one per process, for good)


@pytest.fixture(autouse=True)
def spans() -> Iterator[InProcessSpans]:
    """The spans finished in this process during the test (services run in-process)."""
    _SPANS.clear()
    yield _SPANS
    _SPANS.clear()
