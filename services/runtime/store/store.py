"""The Postgres store: named, guarded reads and writes (this package is the only code
that talks to asyncpg).

Queries are named and live in `sql/*.sql`, one file per service that uses them;
migrations are numbered files in `migrations/`, applied at start-up under an advisory
lock. Every transition is one guarded statement: a method returns the changed run, or
None / LostRace when the guard did not hold (another writer or a newer attempt got there
first). `Store` gathers the query sets of every service (submits, attempts, upkeep,
segments, outbox) over one pool.
"""

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

from runwire.runtime.errors import MigrationsPending, StoreError, Unavailable
from runwire.runtime.store.attempts import ExecutorQueries
from runwire.runtime.store.outbox import OutboxQueries
from runwire.runtime.store.queries import UNAVAILABLE
from runwire.runtime.store.rate_limits import RateLimitQueries
from runwire.runtime.store.rows import Run, parse_run_id
from runwire.runtime.store.schema import QUERIES, init_connection, migrate
from runwire.runtime.store.segments import RelayQueries
from runwire.runtime.store.submits import SubmitterQueries
from runwire.runtime.store.upkeep import RecoveryQueries
from runwire.runtime.store.waits import WaitQueries

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 60.0


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Return a connection to the pool as it is (an open transaction is still rolled back
    by the pool). The default reset (`RESET ALL`, unlock all advisory locks, ...) costs a
    round trip after every query, and no query here leaves session state behind:
    advisory locks on pooled connections are transaction-scoped, and session locks live
    on connections of their own (LockSession, migrations)."""


class Store(
    SubmitterQueries,
    ExecutorQueries,
    RecoveryQueries,
    RelayQueries,
    OutboxQueries,
    WaitQueries,
    RateLimitQueries,
):
    """Named, guarded reads and writes of runs, their events, their frame segments and
    the outbox."""

    @classmethod
    async def connect(
        cls, dsn: str, *, pool_size: int = 10, timeout: float = CONNECT_TIMEOUT_S
    ) -> "Store":
        """Migrate and open a pool, retrying with backoff while Postgres is not up yet.

        Every connection of the pool is opened now and kept however long it stays idle:
        a burst of work (the first after a start, or after a quiet hour) never waits for
        connections to be opened, authenticated and taught runwire's types."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        delay = 0.1
        while True:
            try:
                await migrate(dsn)  # MigrationFailed goes straight to the caller
                pool = await asyncpg.create_pool(
                    dsn,
                    min_size=pool_size,
                    max_size=pool_size,
                    max_inactive_connection_lifetime=0,
                    init=init_connection,
                    reset=_keep_session,
                )
                return cls(pool)
            except MigrationsPending as exc:
                if loop.time() + delay > deadline:
                    raise
                log.warning("%s; retrying in %.1fs", exc.message, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
            except (OSError, asyncpg.PostgresError) as exc:
                if loop.time() + delay > deadline:
                    raise Unavailable(f"Postgres unreachable: {exc}") from exc
                log.warning("Postgres not reachable yet (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def close(self) -> None:
        await self._pool.close()

    @contextlib.asynccontextmanager
    async def session_lock(self, tenant: str, session_id: str) -> AsyncIterator["Store"]:
        """A transaction holding the session's lock until it commits (or rolls back on an
        exception). The yielded store runs every query in that transaction, so the
        submits and aborts of one session happen one after the other."""
        if not isinstance(self._pool, asyncpg.Pool):
            raise StoreError("session_lock inside session_lock")
        try:
            async with self._pool.acquire() as conn, conn.transaction():
                await conn.execute(QUERIES["lock_session"], tenant, session_id)
                yield Store(conn)
        except UNAVAILABLE as exc:
            raise Unavailable(f"Postgres unavailable during a session's lock: {exc}") from exc
        except asyncpg.PostgresError as exc:
            raise StoreError(f"session lock of {session_id!r} failed: {exc}") from exc

    async def get_run(self, tenant: str, run_id: str) -> Run | None:
        key = parse_run_id(run_id)
        return None if key is None else await self._run_or_none("get_run", tenant, key)

    async def get_run_by_id(self, run_id: str) -> Run | None:
        key = parse_run_id(run_id)
        return None if key is None else await self._run_or_none("get_run_by_id", key)

    async def run_by_request(self, tenant: str, request_id: str) -> Run | None:
        return await self._run_or_none("run_by_request", tenant, request_id)

    async def ping(self) -> None:
        """Raise Unavailable unless Postgres answers."""
        await self._fetchrow("ping")

    async def timeline(self) -> list[dict[str, Any]]:
        """Every recorded transition of every run, oldest first."""
        rows = await self._fetch("events_timeline")
        return [{**dict(r), "run_id": str(r["run_id"])} for r in rows]

    async def run_events(self, run_id: str) -> list[dict[str, Any]]:
        """One run's transitions (node events with their node, number and key), oldest
        first."""
        return [dict(r) for r in await self._fetch("run_events", uuid.UUID(run_id))]

    async def run_status_values(self) -> list[str]:
        return [r["enumlabel"] for r in await self._fetch("run_status_values")]
