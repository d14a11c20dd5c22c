"""Fixtures every tier shares: real servers, a database per test, a subject prefix per test.

Servers are started once per test process (each pytest-xdist worker has its own when the
provider starts them). Every test gets a fresh database copied from a migrated template
and a subject prefix of its own, so tests never see each other's runs and can run in
parallel.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Iterator

import pytest

from runwire.testing.servers import Servers
from tests.traces import InProcessSpans


@pytest.fixture(scope="session")
def infra(runwire_servers: Servers) -> Servers:
    """nats-server and Postgres for this test process, with the template database ready
    (the test kit's `runwire_servers`, which users' suites get too)."""
    return runwire_servers


@pytest.fixture
async def db_url(infra: Servers) -> AsyncIterator[str]:
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
def service_env(infra: Servers, db_url: str, prefix: str) -> dict[str, str]:
    """Environment for a service subprocess wired to this test's database and prefix."""
    return {
        **os.environ,
        "RUNWIRE_NATS_URL": infra.nats_url,
        "RUNWIRE_DATABASE_URL": db_url,
        "RUNWIRE_PREFIX": prefix,
        "RUNWIRE_STREAM_REPLICAS": str(infra.stream_replicas),
    }


_SPANS = InProcessSpans()
_SPANS.install()  # the tracer provider of this test process (one per process, for good)


@pytest.fixture(autouse=True)
def spans() -> Iterator[InProcessSpans]:
    """The spans finished in this process during the test (services run in-process)."""
    _SPANS.clear()
    yield _SPANS
    _SPANS.clear()
