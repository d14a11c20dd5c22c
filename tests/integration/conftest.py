"""Integration fixtures: the four services in this process against real servers."""

import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, async_playwright

from runwire.testing.servers import Servers
from tests.reference.server import langgraph_server
from tests.secured import Broker
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


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """LangGraph's own server (tests/reference/), one per test process."""
    with langgraph_server(tmp_path_factory.mktemp("langgraph") / "server.log") as url:
        yield url


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.definition.get_closest_marker("on_a_cluster") and (
        "broker" in metafunc.fixturenames
    ):
        metafunc.parametrize(
            "broker", [1, 3], indirect=True, ids=["one server", "cluster of three"]
        )


@pytest.fixture
async def broker(
    request: pytest.FixtureRequest, tmp_path: Path, prefix: str
) -> AsyncIterator[Broker]:
    """The authenticating broker: one nats-server, or a cluster of `request.param`
    (a test marked `on_a_cluster` runs on both)."""
    running = Broker(tmp_path, prefix, getattr(request, "param", 1))
    running.server.start()
    try:
        yield running
    finally:
        running.server.stop()


@pytest.fixture
async def secured(broker: Broker, db_url: str, prefix: str) -> AsyncIterator[InProcessStack]:
    """The four services on the authenticating broker, each as its own identity."""
    async with InProcessStack(
        broker.services_url,
        db_url,
        prefix,
        identities=broker.identities,
        overrides={"stream_replicas": broker.replicas},
    ) as stack:
        yield stack


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Headless, as root, on a machine without a network beyond loopback.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    """Headless Chromium (Debian's) for the console's tests."""
    assert shutil.which(CHROMIUM), "the browser tests need Chromium: `make test` installs it"
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield launched
        finally:
            await launched.close()
