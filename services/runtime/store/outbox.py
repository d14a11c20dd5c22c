"""The outbox's queries: what a committed transaction implies, the sweep's rows, and
deleting what was published."""

import contextlib
from collections.abc import AsyncIterator, Sequence

import asyncpg

from runwire.runtime.errors import StoreError, Unavailable
from runwire.runtime.store.queries import UNAVAILABLE, Queries
from runwire.runtime.store.rows import OutboxBatch, OutboxKind, OutboxMessage
from runwire.runtime.store.schema import QUERIES

OUTBOX_LOCK_KEY = 7_240_113_002


class OutboxQueries(Queries):
    """Outbox rows as the dispatcher and the sweep publish them."""

    async def outbox_of(self, xacts: Sequence[str]) -> dict[str, list[OutboxMessage]]:
        """What committed transactions imply that their service publishes at once, by
        transaction, each in the order it was written."""
        found: dict[str, list[OutboxMessage]] = {}
        for r in await self._fetch("outbox_of_xacts", list(xacts)):
            found.setdefault(r["xact"], []).append(OutboxMessage.from_record(r))
        return found

    async def archived_seq(self, run_id: str) -> tuple[int, bool]:
        """The seq of the run's last frame written to Postgres segments (0: none), and
        whether its `done` is among them."""
        row = await self._fetchrow("archived_seq", run_id)
        return (int(row["last_seq"]), bool(row["frames_closed"])) if row is not None else (0, False)

    async def outbox_delete(self, ids: Sequence[int]) -> None:
        """Published messages are done."""
        await self._fetch("outbox_delete", list(ids))

    @contextlib.asynccontextmanager
    async def outbox_due(self, grace_ms: int, limit: int) -> AsyncIterator[OutboxBatch]:
        """The sweep's oldest due messages (outbox rows, then run events), locked until
        the block ends; the messages the block adds to `published` are deleted (outbox
        rows) or marked published (run events) when it ends. One caller at a time gets rows (in
        every replica; the others get an empty batch), so run events stay in order."""
        if not isinstance(self._pool, asyncpg.Pool):
            raise StoreError("the outbox sweep needs the pool, not a transaction")
        try:
            async with self._pool.acquire() as conn, conn.transaction():
                if not await conn.fetchval(QUERIES["outbox_lock"], OUTBOX_LOCK_KEY):
                    yield OutboxBatch([])  # another replica is sweeping: in order, alone
                    return
                rows = [
                    *await conn.fetch(QUERIES["outbox_due"], grace_ms, limit),
                    *await conn.fetch(QUERIES["events_due"], limit),
                ]
                batch = OutboxBatch([OutboxMessage.from_record(r) for r in rows])
                yield batch
                # Outbox rows and run_events rows have ids of their own: told apart by kind.
                done_events = [m.id for m in batch.published if m.kind == OutboxKind.EVENT]
                done_rows = [m.id for m in batch.published if m.kind != OutboxKind.EVENT]
                if done_rows:
                    await conn.execute(QUERIES["outbox_delete"], done_rows)
                if done_events:
                    await conn.execute(QUERIES["events_published"], done_events)
        except UNAVAILABLE as exc:
            raise Unavailable(f"Postgres unavailable during the outbox sweep: {exc}") from exc
        except asyncpg.PostgresError as exc:
            raise StoreError(f"outbox sweep failed: {exc}") from exc
