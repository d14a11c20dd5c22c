"""Expired leases: a run whose executor stopped renewing its lease is recovered (its next
attempt is queued after a backoff), or closed as interrupted after too many recoveries
without progress, or closed as canceled when a cancel was asked before its executor
died. What each implies (the job, the closing frames) is written by the same statement
and leaves through the outbox.
"""

import asyncio
import logging

from runwire.contracts.status import RunStatus
from runwire.recovery.decisions import ACTOR, decision_span
from runwire.runtime import tracing
from runwire.runtime.broker import Broker
from runwire.runtime.errors import CANCELED_ERROR, INTERRUPTED_ERROR
from runwire.runtime.logs import bind
from runwire.runtime.metrics import INTERRUPTED, RECOVERIES
from runwire.runtime.outbox import Outbox
from runwire.runtime.settings import RecoverySettings
from runwire.runtime.store import KeptLockSession, Store

log = logging.getLogger(__name__)


class PresenceWatch:
    """Whether executors' presence locks can be believed now.

    A restart of Postgres ends every session at once: every executor loses its presence
    lock and takes it again within a heartbeat, and a run must not be taken from a live
    executor meanwhile. Recovery keeps a session of its own; presence locks are believed
    only once that session has lived `presence_settle_ms` (leases alone tell before)."""

    def __init__(self, dsn: str, settle_ms: int) -> None:
        self._settle_s = settle_ms / 1000
        self._kept = KeptLockSession(dsn)

    async def believed(self) -> bool:
        if await self._kept.check() is not None:
            return False
        return asyncio.get_running_loop().time() - self._kept.opened_at >= self._settle_s

    async def close(self) -> None:
        await self._kept.close()


class ExpiredLeases:
    """The duty that takes over runs whose executor is gone."""

    name = "leases"

    def __init__(
        self,
        settings: RecoverySettings,
        store: Store,
        broker: Broker,
        outbox: Outbox,
        presence: PresenceWatch,
    ) -> None:
        self.settings = settings
        self.store = store
        self.broker = broker
        self.outbox = outbox
        self.presence = presence

    async def run(self) -> dict[str, int]:
        s = self.settings
        runs = await self.store.expire_leases(
            limit=s.batch_size,
            max_recoveries=s.max_recoveries,
            backoff_ms=s.recovery_backoff_ms,
            error=INTERRUPTED_ERROR,
            canceled=CANCELED_ERROR,
            actor=ACTOR,
            by_presence=await self.presence.believed(),
        )
        counts = {"recovering": 0, "interrupted": 0, "canceled": 0}
        for run in runs:
            with bind(run_id=run.run_id, tenant=run.tenant), decision_span(run, run.status):
                if run.job_ack:
                    # The dead executor's job would hold an in-flight slot until its ack
                    # wait ran out: terminate it now (a later attempt gets a new job).
                    await self.broker.notify(run.job_ack, b"+TERM")
                if run.status == RunStatus.INTERRUPTED:
                    counts["interrupted"] += 1
                    INTERRUPTED.inc()
                    log.warning("run interrupted: no progress after repeated recoveries")
                elif run.status == RunStatus.CANCELED:
                    counts["canceled"] += 1
                    log.info("lease expired on a canceled run; closing it")
                else:
                    counts["recovering"] += 1
                    RECOVERIES.inc()
                    log.info("lease expired; run recovering")
                    # The next attempt descends from this decision in the run's trace.
                    traceparent = tracing.current_traceparent()
                    if traceparent and traceparent != run.trace_parent:
                        await self.store.retrace_job(run.run_id, traceparent)
        await self.outbox.dispatch(*runs)
        return counts
