"""Recovery's queries: expired leases, queue timeouts, session turns after a grace,
lost jobs, retention, and the queue gauges. Each takes its rows with `FOR UPDATE SKIP
LOCKED`, so replicas never act twice on a run."""

import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from runwire.contracts.errors import ErrorBody
from runwire.runtime.metrics import TenantQueue
from runwire.runtime.store.locks import EXECUTOR_PRESENCE_LOCKS
from runwire.runtime.store.queries import Queries
from runwire.runtime.store.rows import Run, parse_run_id
from runwire.runtime.store.schema import QUERIES


class RecoveryQueries(Queries):
    """What recovery's duties read and write."""

    async def expire_leases(
        self,
        *,
        limit: int,
        max_recoveries: int,
        backoff_ms: int,
        error: ErrorBody,
        canceled: ErrorBody,
        actor: str,
        by_presence: bool = True,
    ) -> list[Run]:
        """Recover runs whose lease expired, or (`by_presence`) whose executor's presence
        lock is gone; close canceled and stalled ones instead."""
        rows = await self._fetch(
            "expire_leases",
            limit,
            max_recoveries,
            backoff_ms,
            error.model_dump(mode="json"),
            actor,
            canceled.model_dump(mode="json"),
            EXECUTOR_PRESENCE_LOCKS,
            by_presence,
        )
        return [Run.from_record(r) for r in rows]

    async def start_session_turns(self, limit: int, actor: str) -> int:
        """Give their job to the waiting runs of sessions whose turn came without a run
        of theirs ending (a canceled run's grace passed); returns how many."""
        rec = await self._fetchrow("start_session_turns", limit, actor)
        return int(rec["started"]) if rec else 0

    async def start_share_turns(self, limit: int, actor: str) -> int:
        """Give their job to the waiting runs of tenants whose share has room although no
        run of theirs ended; returns how many."""
        rec = await self._fetchrow("start_share_turns", limit, actor)
        return int(rec["started"]) if rec else 0

    async def workflow_sweep(self, limit: int) -> tuple[int, int, str | None]:
        """Time out node runs past their deadline and stop the runs of node runs whose
        workflow run ended: how many of each, and the transaction whose outbox rows
        carry what that implies."""
        rec = await self._fetchrow("workflow_sweep", limit)
        assert rec is not None
        return int(rec["timed_out"]), int(rec["stopped"]), rec["xact"]

    async def close_orphaned_reservations(self) -> int:
        """Close the budget reservations nobody will settle (charged as reserved; an
        effect's never dispatched, released); how many."""
        return len(await self._fetch("close_orphaned_reservations"))

    async def stale_jobs(self, after_ms: int, limit: int) -> dict[str, str]:
        """Runs waiting for an attempt whose job was issued or checked more than
        `after_ms` ago (marked checked now), with their runners: the caller looks for
        their job."""
        rows = await self._fetch("stale_jobs", after_ms, limit)
        return {str(r["run_id"]): r["runner"] for r in rows}

    async def retrace_job(self, run_id: str, traceparent: str) -> None:
        """Make `traceparent` the parent of the attempt the run's pending job starts."""
        await self._fetch("retrace_job", uuid.UUID(run_id), traceparent)

    async def reissue_jobs(self, run_ids: Sequence[str]) -> str | None:
        """A new job for each of these runs still waiting (theirs is gone from the
        stream); returns the transaction whose outbox holds them, if any."""
        rows = await self._fetch("reissue_jobs", [uuid.UUID(r) for r in run_ids])
        return rows[0]["xact"] if rows else None

    async def fire_due_schedules(
        self,
        limit: int,
        plan: Callable[[dict[str, Any]], tuple[list[datetime], datetime, int]],
        actor: str,
    ) -> tuple[int, int]:
        """Fire the schedules that are due, in one transaction: `plan` says, for each,
        which fires to make, its next fire and how many it skips; (schedules fired, runs
        made)."""
        made = 0
        async with self._transaction("fire_schedules") as conn:
            due = await conn.fetch(QUERIES["due_schedules"], limit)
            for schedule in due:
                fires, next_at, skipped = plan(dict(schedule))
                rec = await conn.fetchrow(
                    QUERIES["fire_schedule"],
                    schedule["tenant"],
                    schedule["name"],
                    fires,
                    next_at,
                    skipped,
                    actor,
                )
                made += int(rec["made"]) if rec else 0
        return len(due), made

    async def webhooks_due(self, limit: int, lease_ms: int) -> list[dict[str, Any]]:
        """Up to `limit` deliveries due, each leased for `lease_ms`, with their tenant's
        secret (id, tenant, url, msg_id, body, attempts, secret)."""
        return [dict(r) for r in await self._fetch("webhooks_due", limit, lease_ms)]

    async def webhook_delivered(self, delivery: int) -> None:
        await self._fetch("webhook_delivered", delivery)

    async def webhook_not_delivered(
        self, delivery: int, error: str, again: bool, after_ms: int
    ) -> None:
        """An attempt failed with `error`: tried again after `after_ms` when `again`,
        else the delivery failed for good."""
        await self._fetch("webhook_not_delivered", delivery, error, again, after_ms)

    async def forget_webhooks(self, delivered_s: int, failed_s: int) -> None:
        await self._fetch("forget_webhooks", delivered_s, failed_s)

    async def queue_stats(self) -> list["TenantQueue"]:
        """Per tenant with runs queued, recovering or running: what its queue holds."""
        rows = await self._fetch("queue_stats")
        return [
            TenantQueue(
                r["tenant"], r["depth"], r["oldest_age_s"], r["held"], r["issued"], r["share"]
            )
            for r in rows
        ]

    async def waiting_stats(self) -> list[tuple[str, int, float]]:
        """Per tenant: (tenant, runs waiting for an answer, a signal or a timer, how long
        the oldest of them has waited in seconds)."""
        rows = await self._fetch("waiting_stats")
        return [(r["tenant"], r["waiting"], r["oldest_wait_s"]) for r in rows]

    async def expire_queue(self, *, limit: int, error: ErrorBody, actor: str) -> list[Run]:
        rows = await self._fetch("expire_queue", limit, error.model_dump(mode="json"), actor)
        return [Run.from_record(r) for r in rows]

    async def expire_unserved(
        self, *, limit: int, error: ErrorBody, actor: str, after_ms: int, served: set[str]
    ) -> list[Run]:
        """Fail runs that waited `after_ms` for a first attempt under a runner not in
        `served` (see `expire_unserved` in recovery.sql)."""
        rows = await self._fetch(
            "expire_unserved", limit, error.model_dump(mode="json"), actor, after_ms, sorted(served)
        )
        return [Run.from_record(r) for r in rows]

    async def settled_runs(self, run_ids: Sequence[str]) -> set[str]:
        """Which of `run_ids` need no job any more (ended, or no such run: an id that is
        not a run's id among them)."""
        keys = {run_id: parse_run_id(run_id) for run_id in run_ids}
        valid = {str(key): run_id for run_id, key in keys.items() if key is not None}
        rows = await self._fetch("settled_runs", [uuid.UUID(k) for k in valid])
        settled = {valid[str(r["run_id"])] for r in rows}
        return settled | {run_id for run_id, key in keys.items() if key is None}

    async def purge_due(self, grace_s: float, limit: int) -> list[tuple[str, str]]:
        """Mark ended runs whose stream copy may go now; returns (run_id, tenant)."""
        rows = await self._fetch("purge_due", grace_s, limit)
        return [(str(r["run_id"]), r["tenant"]) for r in rows]

    async def expire_frames(self, retention_s: float, limit: int) -> list[tuple[str, str]]:
        """Delete the segments of runs ended more than `retention_s` ago."""
        rows = await self._fetch("expire_frames", retention_s, limit)
        return [(str(r["run_id"]), r["tenant"]) for r in rows]
