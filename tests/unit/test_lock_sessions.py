"""A lock connection that lost Postgres mid-query: the session is taken for gone, and
its holder goes on (an executor took its presence as lost; it must not stop)."""

from typing import Any

import asyncpg
import pytest

from runwire.runtime.errors import Unavailable
from runwire.runtime.store.locks import KeptLockSession, LockSession


class _BrokenConnection:
    """What asyncpg's connection does after Postgres went away during a query."""

    closed = False

    async def fetchval(self, *args: Any, **kwargs: Any) -> Any:
        raise asyncpg.InternalClientError(
            "cannot switch to state 12; another operation (2) is in progress"
        )

    def is_closed(self) -> bool:
        return self.closed

    async def close(self, timeout: float | None = None) -> None:
        self.closed = True


async def test_a_connection_stuck_in_a_lost_query_is_unavailable() -> None:
    session = LockSession(_BrokenConnection())  # type: ignore[arg-type]
    with pytest.raises(Unavailable, match="another operation"):
        await session.ping()


async def test_a_kept_session_that_lost_postgres_mid_query_reports_it() -> None:
    kept = KeptLockSession("postgresql://unused")
    kept.session = LockSession(_BrokenConnection())  # type: ignore[arg-type]
    failed = await kept.check()
    assert isinstance(failed, Unavailable)
    assert kept.session is None  # the next check opens a new session
