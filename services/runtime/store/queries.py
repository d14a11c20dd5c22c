"""The store's plumbing: running a named query on a pool (or on one connection inside a
transaction) and translating driver errors at this boundary."""

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

from runwire.runtime.errors import (
    LostRace,
    QueueFull,
    QuotaExceeded,
    StoreError,
    StoreRefused,
    Unavailable,
)
from runwire.runtime.store.rows import Run
from runwire.runtime.store.schema import QUERIES

# What the driver raises when Postgres or the connection is away: the query may be tried
# again later. (InternalClientError: a connection that lost Postgres in the middle of a
# query refuses the next one with "another operation is in progress".)
UNAVAILABLE = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
)

# What a statement raises when a quota of the tenant refuses a submit (submit_quota_check).
QUOTA_SQLSTATE = "RWQ01"
# ... and when the tenant's queue is at its capacity (submit_admits).
QUEUE_FULL_SQLSTATE = "RWQ02"
# What Postgres rolls back to break a deadlock (or a serialization conflict), and how
# many times a statement of its own is tried.
CONFLICTS = (asyncpg.DeadlockDetectedError, asyncpg.SerializationError)
CONFLICT_ATTEMPTS = 5
# SQLSTATE classes of what a statement holds, not of the moment: data exception,
# integrity constraint violation.
REFUSED_CLASSES = ("22", "23")

log = logging.getLogger(__name__)


def _failed(name: str, exc: asyncpg.PostgresError) -> Exception:
    if exc.sqlstate == QUOTA_SQLSTATE:
        return QuotaExceeded(str(exc))
    if exc.sqlstate == QUEUE_FULL_SQLSTATE:
        return QueueFull(str(exc))
    if (exc.sqlstate or "")[:2] in REFUSED_CLASSES:
        return StoreRefused(f"query {name} failed: {exc}")
    return StoreError(f"query {name} failed: {exc}")


class Queries:
    """Named queries on a pool, or (inside a session's lock) one connection in a
    transaction. The per-service query sets are subclasses of this."""

    def __init__(self, pool: "asyncpg.Pool | asyncpg.pool.PoolConnectionProxy") -> None:
        self._pool = pool

    async def _fetchrow(self, name: str, *args: Any) -> asyncpg.Record | None:
        rows = await self._fetch(name, *args)
        return rows[0] if rows else None

    async def _fetch(self, name: str, *args: Any) -> list[asyncpg.Record]:
        for attempt in range(1, CONFLICT_ATTEMPTS + 1):
            try:
                return list(await self._pool.fetch(QUERIES[name], *args))
            except UNAVAILABLE as exc:
                raise Unavailable(f"Postgres unavailable during {name}: {exc}") from exc
            except CONFLICTS as exc:
                # A statement of its own (not inside a session's transaction) that Postgres
                # rolled back to break a deadlock changed nothing: run it again.
                if not isinstance(self._pool, asyncpg.Pool) or attempt == CONFLICT_ATTEMPTS:
                    raise _failed(name, exc) from exc
                log.warning("query %s met a deadlock (try %d); running it again", name, attempt)
                await asyncio.sleep(random.uniform(0.005, 0.05) * attempt)
            except asyncpg.PostgresError as exc:
                raise _failed(name, exc) from exc
        raise AssertionError("unreachable")

    @contextlib.asynccontextmanager
    async def _transaction(
        self, name: str
    ) -> AsyncIterator["asyncpg.Connection | asyncpg.pool.PoolConnectionProxy"]:
        """One connection in a transaction (the one this store already runs in, inside a
        session's lock), with driver errors translated like a named query's."""
        try:
            if isinstance(self._pool, asyncpg.Pool):
                async with self._pool.acquire() as conn, conn.transaction():
                    yield conn
            else:
                async with self._pool.transaction():
                    yield self._pool
        except UNAVAILABLE as exc:
            raise Unavailable(f"Postgres unavailable during {name}: {exc}") from exc
        except asyncpg.PostgresError as exc:
            raise _failed(name, exc) from exc

    async def _run_or_none(self, name: str, *args: Any) -> Run | None:
        rec = await self._fetchrow(name, *args)
        return Run.from_record(rec) if rec else None

    async def _transition(self, name: str, run_id: str, *args: Any) -> Run:
        rec = await self._fetchrow(name, uuid.UUID(run_id), *args)
        if rec is None:
            raise LostRace(f"{name} of run {run_id} lost its guard", run_id=run_id)
        return Run.from_record(rec)
