"""runwire's pytest plugin (entry point `pytest11`): fixtures to test a runner against a
real stack.

- `runwire_servers` (session): nats-server and Postgres: `RUNWIRE_TEST_NATS_URL` and
  `RUNWIRE_TEST_DATABASE_URL` when given, else containers when a Docker engine answers,
  else the servers from the pip wheels (`RUNWIRE_TEST_INFRA` forces one).
- `runwire_runners` and `runwire_tools`: runners and tools to register beside the
  installed ones (entry points, `RUNWIRE_RUNNERS`, `RUNWIRE_TOOLS`); `{}` unless a
  `conftest.py` overrides them.
- `runwire_stack`: the four services in the test's event loop, on a database and a
  subject prefix of the test's own, with those runners; `runwire_client`, its client.

The async fixtures need pytest-asyncio (`pip install 'runwire[testing]'`). Without it,
or without the server extra, the plugin only says so when a test asks for a fixture:
loading it never breaks a pytest run.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from runwire.client import Client
    from runwire.testing.servers import Servers
    from runwire.testing.stack import InProcessStack

try:
    import pytest_asyncio

    from runwire.testing.servers import session_servers
    from runwire.testing.stack import InProcessStack
except ImportError as missing:
    _MISSING: str | None = (
        f"runwire's test kit needs `pip install 'runwire[server,testing]'` ({missing})"
    )
else:
    _MISSING = None


@pytest.fixture(scope="session")
def runwire_servers() -> Iterator[Servers]:
    """nats-server and Postgres for this test process, with a migrated template database."""
    if _MISSING is not None:
        pytest.fail(_MISSING)
    with session_servers() as servers:
        yield servers


@pytest.fixture
def runwire_runners() -> dict[str, Any]:
    """Runners (name → async function or `runwire.runner` declaration) to register on
    the stack beside the installed ones. Override it in a `conftest.py`."""
    return {}


@pytest.fixture
def runwire_tools() -> dict[str, Any]:
    """Tools (name → `runwire.tool` declaration) to register on the stack's executor
    beside the installed ones. Override it in a `conftest.py`."""
    return {}


if _MISSING is None:

    @pytest_asyncio.fixture
    async def runwire_stack(
        runwire_servers: Servers, runwire_runners: dict[str, Any], runwire_tools: dict[str, Any]
    ) -> AsyncIterator[InProcessStack]:
        """The four services with the test's runners, on a database and a prefix of the
        test's own; stopped and dropped afterwards."""
        name = f"t_{secrets.token_hex(6)}"
        db_url = await runwire_servers.create_database(name)
        prefix = f"t{secrets.token_hex(4)}"
        try:
            async with InProcessStack(
                runwire_servers.nats_url,
                db_url,
                prefix,
                overrides={"stream_replicas": runwire_servers.stream_replicas},
                runners=runwire_runners,
                tools=runwire_tools,
            ) as stack:
                yield stack
        finally:
            await runwire_servers.drop_database(name)

    @pytest_asyncio.fixture
    async def runwire_client(runwire_stack: InProcessStack) -> Client:
        """A client of `runwire_stack` (tenant `default`)."""
        return runwire_stack.client

else:

    @pytest.fixture
    def runwire_stack() -> None:
        pytest.fail(str(_MISSING))

    @pytest.fixture
    def runwire_client() -> None:
        pytest.fail(str(_MISSING))
