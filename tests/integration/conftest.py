"""Integration fixtures: the four services in this process against real servers."""

from collections.abc import AsyncIterator

import pytest

from runwire.testing.servers import Servers
from tests.services import InProcessStack


@pytest.fixture
async def stack(
    request: pytest.FixtureRequest, infra: Servers, db_url: str, prefix: str
) -> AsyncIterator[InProcessStack]:
    """Submitter, executor, relay and recovery, wired to this test's database and prefix,
    each connected to Postgres as its own role where the servers allow it; a test's
    `@pytest.mark.stack(...)` overrides their settings."""
    marker = request.node.get_closest_marker("stack")
    overrides = {"stream_replicas": infra.stream_replicas, **(marker.kwargs if marker else {})}
    async with InProcessStack(
        infra.nats_url, db_url, prefix, overrides=overrides, db_roles=infra.service_roles
    ) as running:
        yield running
