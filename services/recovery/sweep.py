"""One recovery tick: expired leases, queue timeouts, session turns, lost jobs, unclosed
runs.

Every step is a guarded write with `FOR UPDATE SKIP LOCKED`, so any number of
recovery replicas can tick at once without acting twice on a run.
"""

import logging
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass

from opentelemetry.trace import Span

from contracts.frames import Job
from contracts.status import RunStatus
from services.runtime import tracing
from services.runtime.broker import Broker
from services.runtime.closing import publish_closing
from services.runtime.errors import (
    CANCELED_ERROR,
    INTERRUPTED_ERROR,
    QUEUE_TIMEOUT_ERROR,
    RunwireError,
)
from services.runtime.logs import bind
from services.runtime.metrics import INTERRUPTED as INTERRUPTED_RUNS
from services.runtime.metrics import QUEUE, RECOVERIES
from services.runtime.settings import RecoverySettings
from services.runtime.store import Run, Store

log = logging.getLogger(__name__)

ACTOR = "recovery"


@dataclass
class TickReport:
    """What one tick did, for logs and tests."""

    recovering: int = 0
    interrupted: int = 0
    canceled: int = 0
    timed_out: int = 0
    released: int = 0
    republished: int = 0
    closed: int = 0
    purged: int = 0
    expired: int = 0

    def any(self) -> bool:
        return any(vars(self).values())


def _decision_span(
    run_id: str,
    tenant: str,
    traceparent: str | None,
    decision: str,
    *,
    attempt: int | None = None,
    generation: int | None = None,
) -> AbstractContextManager[Span]:
    """A span in the run's trace for what recovery decided about it."""
    attributes = tracing.run_attributes(run_id, tenant, attempt=attempt, generation=generation)
    return tracing.span(
        "recovery decision",
        tracing.context_of(traceparent),
        attributes={**attributes, "decision": decision},
    )


class Sweeper:
    """Runs recovery ticks."""

    def __init__(self, settings: RecoverySettings, store: Store, broker: Broker) -> None:
        self.settings = settings
        self.store = store
        self.broker = broker

    async def tick(self) -> TickReport:
        s = self.settings
        report = TickReport()
        for run in await self.store.expire_leases(
            limit=s.batch_size,
            max_recoveries=s.max_recoveries,
            backoff_ms=s.recovery_backoff_ms,
            error=INTERRUPTED_ERROR,
            canceled=CANCELED_ERROR,
            actor=ACTOR,
        ):
            with bind(run_id=run.run_id, tenant=run.tenant), self._decision(run, run.status.value):
                if run.job_ack:
                    # The dead executor's job would hold an in-flight slot until its ack
                    # wait ran out: terminate it now (a later attempt gets a new job).
                    await self.broker.notify(run.job_ack, b"+TERM")
                if run.status == RunStatus.INTERRUPTED:
                    report.interrupted += 1
                    INTERRUPTED_RUNS.inc()
                    log.warning("run interrupted: no progress after repeated recoveries")
                    await self._close(run)
                elif run.status == RunStatus.CANCELED:
                    report.canceled += 1
                    log.info("lease expired on a canceled run; closing it")
                    await self._close(run)
                else:
                    report.recovering += 1
                    RECOVERIES.inc()
                    log.info("lease expired; run recovering")
                    await self._publish_job(run.run_id, run.tenant, run.generation)
        for run in await self.store.expire_queue(
            limit=s.batch_size, error=QUEUE_TIMEOUT_ERROR, actor=ACTOR
        ):
            report.timed_out += 1
            with self._decision(run, "queue timeout"):
                await self._close(run)
        # Runs that waited for their session, whose turn came without anyone noticing:
        # the run before them ended in this tick or in a crashed process, or it was
        # canceled and its grace has passed.
        for run in await self.store.release_session(None, None, ACTOR, limit=s.batch_size):
            # Also a retry whose backoff is over.
            decision = "retry due" if run.attempts > 0 else "session turn"
            with bind(run_id=run.run_id, tenant=run.tenant), self._decision(run, decision):
                report.released += 1
                log.info("the run's %s came", "retry" if run.attempts > 0 else "session turn")
                await self._publish_job(run.run_id, run.tenant, run.generation)
        stale = await self.store.stale_queued(s.republish_after_ms, s.batch_size)
        # One listing of the jobs stream for the whole batch (a long queue makes many
        # runs stale at once), or, if it cannot be had, one look per run.
        waiting = await self.broker.jobs_waiting() if stale else None
        for run_id, tenant, generation, traceparent in stale:
            # A job still waiting in the stream (a long queue) needs no copy; a lost one
            # (stream deleted or purged, publish failed) is published again.
            if (run_id in waiting) if waiting is not None else await self.broker.job_queued(run_id):
                continue
            report.republished += 1
            with _decision_span(
                run_id, tenant, traceparent, "job lost; published again", generation=generation
            ):
                await self._publish_job(run_id, tenant, generation, copy=f"r{time.time_ns()}")
        for run in await self.store.unclosed_terminal(s.close_grace_ms, s.batch_size):
            report.closed += 1
            with self._decision(run, "closing frames missing"):
                await self._close(run)
        await self._retention(report)
        # Measured after the tick's changes, so the gauges show what is left waiting.
        QUEUE.update(await self.store.queue_stats())
        return report

    async def _retention(self, report: TickReport) -> None:
        """Ended runs leave the stream after a grace, and Postgres after the retention."""
        s, subjects = self.settings, self.broker.subjects
        grace = s.stream_purge_grace.total_seconds()
        for run_id, tenant in await self.store.purge_due(grace, s.batch_size):
            # Marked first: a purge that fails now leaves frames in the stream until
            # its max age, which is harmless, while Postgres already has them all.
            await self.broker.purge_subject(
                subjects.run_frames_stream, subjects.run_frames(tenant, run_id)
            )
            report.purged += 1
        expired = await self.store.expire_frames(s.frame_retention.total_seconds(), s.batch_size)
        report.expired += len(expired)

    @staticmethod
    def _decision(run: Run, decision: str) -> AbstractContextManager[Span]:
        return _decision_span(
            run.run_id,
            run.tenant,
            run.trace_parent,
            decision,
            attempt=run.attempts,
            generation=run.generation,
        )

    async def _publish_job(
        self, run_id: str, tenant: str, generation: int, *, copy: str = ""
    ) -> None:
        """Publish a job inside the decision's span: the attempt it starts descends from it."""
        try:
            await self.broker.publish_job(
                Job(run_id=run_id, tenant=tenant, generation=generation),
                traceparent=tracing.current_traceparent(),
                copy=copy,
            )
        except RunwireError as exc:
            log.warning("job of run %s not published, next tick retries: %s", run_id, exc.message)

    async def _close(self, run: Run) -> None:
        try:
            await publish_closing(self.broker, run)
        except RunwireError as exc:
            log.warning("closing frames not published, a later tick retries: %s", exc.message)
