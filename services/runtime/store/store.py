"""The Postgres store: named, guarded reads and writes (this package is the only code
that talks to asyncpg).

Queries are named and live in `sql/queries.sql`; migrations are numbered files in
`migrations/`, applied at start-up under an advisory lock. Every transition is one
guarded statement: a method returns the changed run, or None / LostRace when the
guard did not hold (another writer or a newer attempt got there first).
"""

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg

from contracts.errors import ErrorBody
from contracts.status import RunStatus
from services.runtime.errors import CANCELED_ERROR, LostRace, StoreError, Unavailable
from services.runtime.settings import DEFAULT_SUPERSEDE_GRACE_MS
from services.runtime.store.rows import (
    OutboxBatch,
    OutboxMessage,
    Run,
    Segment,
    SegmentCount,
    StoredSegment,
    parse_run_id,
)
from services.runtime.store.schema import QUERIES, init_connection, migrate

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 60.0
CANCELED_BODY = CANCELED_ERROR.model_dump(mode="json")
OUTBOX_LOCK_KEY = 7_240_113_002


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Return a connection to the pool as it is (an open transaction is still rolled back
    by the pool). The default reset (`RESET ALL`, unlock all advisory locks, ...) costs a
    round trip after every query, and no query here leaves session state behind:
    advisory locks on pooled connections are transaction-scoped, and session locks live
    on connections of their own (LockSession, migrations)."""


class Store:
    """Named, guarded reads and writes of runs, their events and their frame segments."""

    def __init__(self, pool: "asyncpg.Pool | asyncpg.pool.PoolConnectionProxy") -> None:
        # A pool, or (inside `session_lock`) one connection in a transaction.
        self._pool = pool

    @classmethod
    async def connect(
        cls, dsn: str, *, pool_size: int = 10, timeout: float = CONNECT_TIMEOUT_S
    ) -> "Store":
        """Migrate and open a pool, retrying with backoff while Postgres is not up yet."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        delay = 0.1
        while True:
            try:
                await migrate(dsn)  # MigrationFailed goes straight to the caller
                pool = await asyncpg.create_pool(
                    dsn,
                    min_size=1,
                    max_size=pool_size,
                    init=init_connection,
                    reset=_keep_session,
                )
                return cls(pool)
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
        except (OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError) as exc:
            raise Unavailable(f"Postgres unavailable during a session's lock: {exc}") from exc
        except asyncpg.PostgresError as exc:
            raise StoreError(f"session lock of {session_id!r} failed: {exc}") from exc

    # -- plumbing ---------------------------------------------------------------
    async def _fetchrow(self, name: str, *args: Any) -> asyncpg.Record | None:
        try:
            return await self._pool.fetchrow(QUERIES[name], *args)
        except (OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError) as exc:
            raise Unavailable(f"Postgres unavailable during {name}: {exc}") from exc
        except asyncpg.PostgresError as exc:
            raise StoreError(f"query {name} failed: {exc}") from exc

    async def _fetch(self, name: str, *args: Any) -> list[asyncpg.Record]:
        try:
            return list(await self._pool.fetch(QUERIES[name], *args))
        except (OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError) as exc:
            raise Unavailable(f"Postgres unavailable during {name}: {exc}") from exc
        except asyncpg.PostgresError as exc:
            raise StoreError(f"query {name} failed: {exc}") from exc

    async def _run_or_none(self, name: str, *args: Any) -> Run | None:
        rec = await self._fetchrow(name, *args)
        return Run.from_record(rec) if rec else None

    async def _transition(self, name: str, run_id: str, *args: Any) -> Run:
        rec = await self._fetchrow(name, uuid.UUID(run_id), *args)
        if rec is None:
            raise LostRace(f"{name} of run {run_id} lost its guard", run_id=run_id)
        return Run.from_record(rec)

    # -- reads -------------------------------------------------------------------
    async def get_run(self, tenant: str, run_id: str) -> Run | None:
        key = parse_run_id(run_id)
        return None if key is None else await self._run_or_none("get_run", tenant, key)

    async def get_run_by_id(self, run_id: str) -> Run | None:
        key = parse_run_id(run_id)
        return None if key is None else await self._run_or_none("get_run_by_id", key)

    async def frame_states(self, run_ids: list[str]) -> dict[str, tuple[int, bool]]:
        """For each run that exists: (last frame seq written, whether its frames are
        closed), in one query."""
        keys = [key for run_id in run_ids if (key := parse_run_id(run_id)) is not None]
        if not keys:
            return {}
        rows = await self._fetch("frame_states", keys)
        return {str(r["run_id"]): (r["last_seq"], r["frames_closed"]) for r in rows}

    async def run_by_request(self, tenant: str, request_id: str) -> Run | None:
        return await self._run_or_none("run_by_request", tenant, request_id)

    async def session_active(self, tenant: str, session_id: str) -> list[str]:
        return [str(r["run_id"]) for r in await self._fetch("session_active", tenant, session_id)]

    async def segments_after(self, run_id: str, after: int) -> list[StoredSegment]:
        rows = await self._fetch("segments_after", uuid.UUID(run_id), after)
        return [
            StoredSegment(
                r["first_seq"], r["last_seq"], r["last_stream_seq"], r["frames"], r["size"]
            )
            for r in rows
        ]

    async def segment_ranges(self, run_id: str) -> list[tuple[int, int, int]]:
        """(first_seq, last_seq, last_stream_seq) of each segment of a run, in order."""
        rows = await self._fetch("segment_ranges", uuid.UUID(run_id))
        return [(r["first_seq"], r["last_seq"], r["last_stream_seq"]) for r in rows]

    # -- the outbox ----------------------------------------------------------------
    async def outbox_of(self, xact: str) -> list[OutboxMessage]:
        """What a committed transaction implies that its service publishes at once."""
        return [OutboxMessage.from_record(r) for r in await self._fetch("outbox_of_xact", xact)]

    async def outbox_delete(self, ids: Sequence[int]) -> None:
        """Published messages are done."""
        await self._fetch("outbox_delete", list(ids))

    async def outbox_pending(self) -> dict[str, int]:
        """Messages waiting in the outbox, by kind."""
        return {r["kind"]: r["n"] for r in await self._fetch("outbox_pending")}

    @contextlib.asynccontextmanager
    async def outbox_due(self, grace_ms: int, limit: int) -> AsyncIterator[OutboxBatch]:
        """The sweep's oldest due messages, locked until the block ends; the ids the block
        adds to `published` are deleted when it ends. One caller at a time gets rows (in
        every replica; the others get an empty batch), so run events stay in order."""
        if not isinstance(self._pool, asyncpg.Pool):
            raise StoreError("the outbox sweep needs the pool, not a transaction")
        try:
            async with self._pool.acquire() as conn, conn.transaction():
                if not await conn.fetchval(QUERIES["outbox_lock"], OUTBOX_LOCK_KEY):
                    yield OutboxBatch([])  # another replica is sweeping: in order, alone
                    return
                rows = await conn.fetch(QUERIES["outbox_due"], grace_ms, limit)
                batch = OutboxBatch([OutboxMessage.from_record(r) for r in rows])
                yield batch
                if batch.published:
                    await conn.execute(QUERIES["outbox_delete"], batch.published)
        except (OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError) as exc:
            raise Unavailable(f"Postgres unavailable during the outbox sweep: {exc}") from exc
        except asyncpg.PostgresError as exc:
            raise StoreError(f"outbox sweep failed: {exc}") from exc

    async def mark_frames_closed(self, run_id: str) -> None:
        await self._fetch("mark_frames_closed", uuid.UUID(run_id))

    async def ping(self) -> None:
        """Raise Unavailable unless Postgres answers."""
        await self._fetchrow("ping")

    async def timeline(self) -> list[dict[str, Any]]:
        """Every recorded transition of every run, oldest first."""
        rows = await self._fetch("events_timeline")
        return [{**dict(r), "run_id": str(r["run_id"])} for r in rows]

    async def run_status_values(self) -> list[str]:
        return [r["enumlabel"] for r in await self._fetch("run_status_values")]

    # -- submitter ---------------------------------------------------------------
    async def insert_run(
        self,
        *,
        run_id: str,
        tenant: str,
        request_id: str,
        session_id: str | None,
        multitask: str,
        runner: str,
        input: dict[str, Any],
        metadata: dict[str, Any],
        max_attempts: int,
        attempt_timeout_ms: int,
        queue_timeout_ms: int | None,
        actor: str,
        trace_parent: str | None = None,
    ) -> Run | None:
        """Create a queued run; None when the tenant already has this request_id."""
        return await self._run_or_none(
            "insert_run",
            uuid.UUID(run_id),
            tenant,
            request_id,
            session_id,
            multitask,
            runner,
            input,
            metadata,
            max_attempts,
            attempt_timeout_ms,
            queue_timeout_ms,
            actor,
            trace_parent,
        )

    async def request_cancel(
        self,
        tenant: str,
        run_id: str,
        error: ErrorBody,
        actor: str,
        *,
        grace_ms: int = DEFAULT_SUPERSEDE_GRACE_MS,
    ) -> Run | None:
        """Cancel a queued run, or flag a running one (closed later with `error`, holding
        its session for at most `grace_ms`); None when the run is terminal."""
        key = parse_run_id(run_id)
        if key is None:
            return None
        return await self._run_or_none(
            "request_cancel", tenant, key, error.model_dump(mode="json"), actor, grace_ms
        )

    async def cancel_session(
        self, tenant: str, session_id: str, error: ErrorBody, actor: str, *, grace_ms: int
    ) -> list[Run]:
        """`request_cancel` for every active run of a session, oldest first."""
        rows = await self._fetch(
            "cancel_session", tenant, session_id, error.model_dump(mode="json"), grace_ms, actor
        )
        return [Run.from_record(r) for r in rows]

    async def release_sessions(self, limit: int, actor: str) -> int:
        """Give their job to the waiting runs of sessions whose turn came without a run
        of theirs ending (a canceled run's grace passed); returns how many."""
        rec = await self._fetchrow("release_sessions", limit, actor)
        return int(rec["released"]) if rec else 0

    async def fail_queued(self, run_id: str, error: ErrorBody, actor: str) -> Run | None:
        return await self._run_or_none(
            "fail_queued", uuid.UUID(run_id), error.model_dump(mode="json"), actor
        )

    # -- executor ----------------------------------------------------------------
    async def claim(
        self, run_id: str, generation: int, owner: str, lease_ms: int, job_ack: str | None = None
    ) -> Run | None:
        """Start an attempt; None when this job is stale, not due, canceled or timed out.

        `job_ack` is the job message's acknowledgement subject, kept so that recovery can
        release the job at once if this executor dies."""
        return await self._run_or_none(
            "claim_run", uuid.UUID(run_id), generation, owner, lease_ms, job_ack
        )

    async def heartbeat(
        self, run_id: str, generation: int, lease_ms: int, partial_text: str
    ) -> bool:
        """Renew the lease; returns whether a cancel was requested. LostRace if fenced out."""
        rec = await self._fetchrow(
            "heartbeat", uuid.UUID(run_id), generation, lease_ms, partial_text
        )
        if rec is None:
            raise LostRace(f"attempt {generation} of run {run_id} lost its lease", run_id=run_id)
        return bool(rec["cancel_requested"])

    async def cancel_requested(self, run_id: str, generation: int) -> bool:
        """Whether a cancel was requested; LostRace if the attempt was fenced out."""
        rec = await self._fetchrow("cancel_requested", uuid.UUID(run_id), generation)
        if rec is None:
            raise LostRace(f"attempt {generation} of run {run_id} lost its lease", run_id=run_id)
        return bool(rec["cancel_requested"])

    async def save_checkpoint(
        self, run_id: str, generation: int, state: Any, partial_text: str
    ) -> int:
        rec = await self._fetchrow(
            "save_checkpoint", uuid.UUID(run_id), generation, state, partial_text
        )
        if rec is None:
            raise LostRace(f"attempt {generation} of run {run_id} lost its lease", run_id=run_id)
        return int(rec["checkpoint_version"])

    # An attempt's closing transitions take `close_seq`, the attempt's next frame seq: the
    # frames the transition implies (`error`, `done`) follow the attempt's own. And
    # `trace_parent_of_implied`: the span that decided the transition, parent of what it
    # implies in the run's trace.
    async def finish(
        self,
        run_id: str,
        generation: int,
        result: dict[str, Any],
        partial_text: str,
        actor: str,
        close_seq: int,
        trace_parent_of_implied: str | None = None,
    ) -> Run:
        return await self._transition(
            "finish_run",
            run_id,
            generation,
            result,
            partial_text,
            actor,
            close_seq,
            trace_parent_of_implied,
        )

    async def close_attempt(
        self,
        run_id: str,
        generation: int,
        status: RunStatus,
        error: ErrorBody,
        partial_text: str,
        actor: str,
        close_seq: int,
        trace_parent_of_implied: str | None = None,
    ) -> Run:
        return await self._transition(
            "close_attempt",
            run_id,
            generation,
            status.value,
            error.model_dump(mode="json"),
            partial_text,
            actor,
            close_seq,
            trace_parent_of_implied,
        )

    async def cancel_attempt(
        self,
        run_id: str,
        generation: int,
        error: ErrorBody,
        partial_text: str,
        actor: str,
        close_seq: int,
        trace_parent_of_implied: str | None = None,
    ) -> Run:
        """Close a running attempt as canceled, with the error its canceller chose
        (`error` when none was recorded)."""
        return await self._transition(
            "cancel_attempt",
            run_id,
            generation,
            error.model_dump(mode="json"),
            partial_text,
            actor,
            close_seq,
            trace_parent_of_implied,
        )

    async def requeue(
        self,
        run_id: str,
        generation: int,
        error: ErrorBody,
        partial_text: str,
        delay_ms: int,
        actor: str,
        close_seq: int,
        trace_parent_of_implied: str | None = None,
    ) -> Run:
        """Back to the queue after `delay_ms` (its job is published once due), or
        canceled if a cancel arrived while the attempt was ending. `trace_parent_of_implied`:
        the span that decided the retry, parent of the next attempt."""
        return await self._transition(
            "requeue_run",
            run_id,
            generation,
            error.model_dump(mode="json"),
            partial_text,
            delay_ms,
            actor,
            CANCELED_BODY,
            close_seq,
            trace_parent_of_implied,
        )

    async def release(
        self,
        run_id: str,
        generation: int,
        partial_text: str,
        actor: str,
        close_seq: int,
        trace_parent_of_implied: str | None = None,
    ) -> Run:
        """Back to the queue, not counted (shutdown), or canceled if one was asked."""
        return await self._transition(
            "release_run",
            run_id,
            generation,
            partial_text,
            actor,
            CANCELED_BODY,
            close_seq,
            trace_parent_of_implied,
        )

    # -- recovery ----------------------------------------------------------------
    async def expire_leases(
        self,
        *,
        limit: int,
        max_recoveries: int,
        backoff_ms: int,
        error: ErrorBody,
        canceled: ErrorBody,
        actor: str,
    ) -> list[Run]:
        """Recover runs whose lease expired; close canceled and stalled ones instead."""
        rows = await self._fetch(
            "expire_leases",
            limit,
            max_recoveries,
            backoff_ms,
            error.model_dump(mode="json"),
            actor,
            canceled.model_dump(mode="json"),
        )
        return [Run.from_record(r) for r in rows]

    async def stale_jobs(self, after_ms: int, limit: int) -> list[str]:
        """Runs waiting for an attempt whose job was issued or checked more than
        `after_ms` ago (marked checked now): the caller looks for their job."""
        return [str(r["run_id"]) for r in await self._fetch("stale_jobs", after_ms, limit)]

    async def retrace_job(self, run_id: str, traceparent: str) -> None:
        """Make `traceparent` the parent of the attempt the run's pending job starts."""
        await self._fetch("retrace_job", uuid.UUID(run_id), traceparent)

    async def reissue_jobs(self, run_ids: Sequence[str]) -> str | None:
        """A new job for each of these runs still waiting (theirs is gone from the
        stream); returns the transaction whose outbox holds them, if any."""
        rows = await self._fetch("reissue_jobs", [uuid.UUID(r) for r in run_ids])
        return rows[0]["xact"] if rows else None

    async def queue_stats(self) -> list[tuple[str, int, float]]:
        """Per tenant: (tenant, runs waiting for an attempt, oldest one's age in seconds)."""
        rows = await self._fetch("queue_stats")
        return [(r["tenant"], r["depth"], r["oldest_age_s"]) for r in rows]

    async def expire_queue(self, *, limit: int, error: ErrorBody, actor: str) -> list[Run]:
        rows = await self._fetch("expire_queue", limit, error.model_dump(mode="json"), actor)
        return [Run.from_record(r) for r in rows]

    async def purge_due(self, grace_s: float, limit: int) -> list[tuple[str, str]]:
        """Mark ended runs whose stream copy may go now; returns (run_id, tenant)."""
        rows = await self._fetch("purge_due", grace_s, limit)
        return [(str(r["run_id"]), r["tenant"]) for r in rows]

    async def expire_frames(self, retention_s: float, limit: int) -> list[tuple[str, str]]:
        """Delete the segments of runs ended more than `retention_s` ago."""
        rows = await self._fetch("expire_frames", retention_s, limit)
        return [(str(r["run_id"]), r["tenant"]) for r in rows]

    # -- relay -------------------------------------------------------------------
    async def insert_segments(self, segments: Sequence[Segment]) -> list[SegmentCount]:
        """Write one flush: a segment per run and the runs' counters, in one statement.

        Returns each touched run's counters, so a closed run missing frames is noticed.
        """
        if not segments:
            return []
        rows = await self._fetch(
            "insert_segments",
            [uuid.UUID(s.run_id) for s in segments],
            [s.first_seq for s in segments],
            [s.last_seq for s in segments],
            [s.last_stream_seq for s in segments],
            ["[" + ",".join(s.frames) + "]" for s in segments],
            [s.closed for s in segments],
        )
        return [
            SegmentCount(
                str(r["run_id"]), r["tenant"], r["last_seq"], r["frame_count"], r["done_written"]
            )
            for r in rows
        ]
