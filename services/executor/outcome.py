"""The one place that maps an attempt's outcome to Postgres and to JetStream.

- finished → finish + `done` + ack;
- retryable error with attempts left → requeue with backoff + `error` frame + ack
  (recovery publishes the job once due);
- fatal or exhausted → fail + `error` + `done` + term;
- canceled → cancel (with the error the canceller chose: CANCELED or SUPERSEDED)
  + `done` + ack;
- shutdown → release (not counted) + new job + ack;
- lease lost → ack only (the newer attempt owns the run).

A cancel that arrives while an attempt ends closes the run as canceled instead. Then,
for a run of a session, the next run of the session gets its job if its turn has come.
"""

import logging
import random
from dataclasses import dataclass

from nats.aio.msg import Msg

from contracts.errors import ErrorBody, ErrorCode
from contracts.frames import FrameType, Job
from contracts.status import RunStatus
from services.executor.attempt import AbortReason, Attempt, Outcome
from services.runtime import tracing
from services.runtime.broker import Broker
from services.runtime.errors import CANCELED_ERROR, LostRace, RunwireError
from services.runtime.logs import fields
from services.runtime.metrics import ATTEMPT_OUTCOMES, RETRIES
from services.runtime.settings import ExecutorSettings
from services.runtime.store import Run, Store

log = logging.getLogger(__name__)


def backoff_ms(attempt: int, base_ms: int, max_ms: int, rng: random.Random) -> int:
    """Exponential backoff with full jitter in its upper half."""
    ceiling = min(max_ms, base_ms * 2 ** max(0, attempt - 1))
    return int(ceiling * (0.5 + rng.random() / 2))


def timeout_error(timeout_ms: int) -> ErrorBody:
    return ErrorBody(
        code=ErrorCode.ATTEMPT_TIMEOUT,
        message=f"the attempt ran past its deadline of {timeout_ms} ms",
        retryable=True,
    )


@dataclass
class Settler:
    """Records outcomes for one executor process."""

    store: Store
    broker: Broker
    settings: ExecutorSettings
    owner: str
    rng: random.Random

    async def settle(self, attempt: Attempt, outcome: Outcome, msg: Msg) -> None:
        """Write the outcome (fenced by generation), publish its frames, ack the job."""
        run = attempt.run
        # A failed attempt's span is the retry decision (retry, or fail for good).
        failing = outcome.error is not None or outcome.abort == AbortReason.TIMEOUT
        with tracing.span(
            "retry decision" if failing else "outcome",
            attributes=tracing.run_attributes(
                run.run_id, run.tenant, attempt=run.attempts, generation=attempt.generation
            ),
        ) as current:
            try:
                decision = await self._settle(attempt, outcome, msg)
            except LostRace:
                log.warning("outcome not recorded: a newer attempt owns the run")
                await msg.ack()
                decision = "lost"
            current.set_attribute("decision", decision)
            if outcome.error is not None:
                current.set_attribute("code", outcome.error.code.value)
        if decision != "lost":
            await self.next_in_session(attempt.run)

    async def next_in_session(self, run: Run) -> None:
        """Give their job to the runs of `run`'s session whose turn has come."""
        if run.session_id is None:
            return
        try:
            released = await self.store.release_session(run.tenant, run.session_id, self.owner)
        except RunwireError as exc:
            log.warning("next run of the session not released, recovery will: %s", exc.message)
            return
        for nxt in released:
            log.info("next run of the session released", extra=fields(next_run_id=nxt.run_id))
            await self._queue(
                Job(run_id=nxt.run_id, tenant=nxt.tenant, generation=nxt.generation),
                nxt.trace_parent,
            )

    async def _settle(self, attempt: Attempt, outcome: Outcome, msg: Msg) -> str:
        """Record the outcome; returns the decision (finished, retry, failed, ...)."""
        run, gen, text = attempt.run, attempt.generation, attempt.partial_text
        if outcome.result is not None:
            await self.store.finish(
                run.run_id, gen, {"text": text, **outcome.result}, text, self.owner
            )
            await attempt.publish(FrameType.DONE, {"status": RunStatus.FINISHED.value})
            await msg.ack()
            ATTEMPT_OUTCOMES.labels("finished", "none").inc()
            log.info("run finished", extra=fields(attempt=run.attempts))
            return "finished"
        if outcome.abort == AbortReason.LOST:
            await msg.ack()
            ATTEMPT_OUTCOMES.labels("lost", "none").inc()
            return "lost"
        if outcome.abort == AbortReason.CANCEL:
            closed = await self.store.cancel_attempt(
                run.run_id, gen, CANCELED_ERROR, text, self.owner
            )
            code = (closed.error or {}).get("code", ErrorCode.CANCELED.value)
            await attempt.publish(
                FrameType.DONE, {"status": RunStatus.CANCELED.value, "code": code}
            )
            await msg.ack()
            ATTEMPT_OUTCOMES.labels("canceled", code).inc()
            log.info("run canceled", extra=fields(attempt=run.attempts, code=code))
            return "canceled"
        if outcome.abort == AbortReason.SHUTDOWN:
            released = await self.store.release(run.run_id, gen, text, self.owner)
            if await self._closed_by_cancel(attempt, released, msg):
                return "canceled"
            await self._queue(
                Job(run_id=run.run_id, tenant=run.tenant, generation=gen), run.trace_parent
            )
            await msg.ack()
            ATTEMPT_OUTCOMES.labels("released", "none").inc()
            log.info("attempt returned to the queue for shutdown")
            return "released"
        error = outcome.error or timeout_error(run.attempt_timeout_ms)
        if error.retryable and run.attempts < run.max_attempts:
            delay = backoff_ms(
                run.attempts, self.settings.retry_base_ms, self.settings.retry_max_ms, self.rng
            )
            requeued = await self.store.requeue(run.run_id, gen, error, text, delay, self.owner)
            await attempt.publish(FrameType.ERROR, error.model_dump(mode="json"))
            if await self._closed_by_cancel(attempt, requeued, msg):
                return "canceled"
            # No job yet: recovery publishes it once the backoff is over, so that it does
            # not wait inside an executor holding a slot of the in-flight limit.
            await msg.ack()
            ATTEMPT_OUTCOMES.labels("retry", error.code.value).inc()
            RETRIES.labels(error.code.value).inc()
            log.info(
                "attempt failed; retrying",
                extra=fields(attempt=run.attempts, code=error.code, delay_ms=delay),
            )
            return "retry"
        await self.store.close_attempt(run.run_id, gen, RunStatus.FAILED, error, text, self.owner)
        await attempt.publish(FrameType.ERROR, error.model_dump(mode="json"))
        await attempt.publish(
            FrameType.DONE, {"status": RunStatus.FAILED.value, "code": error.code.value}
        )
        await msg.term()
        ATTEMPT_OUTCOMES.labels("failed", error.code.value).inc()
        log.info("run failed", extra=fields(attempt=run.attempts, code=error.code))
        return "failed"

    async def _closed_by_cancel(self, attempt: Attempt, run: Run, msg: Msg) -> bool:
        """A cancel that arrived while the attempt was ending closed the run: say so."""
        if run.status != RunStatus.CANCELED:
            return False
        code = (run.error or {}).get("code", ErrorCode.CANCELED.value)
        await attempt.publish(FrameType.DONE, {"status": RunStatus.CANCELED.value, "code": code})
        await msg.ack()
        ATTEMPT_OUTCOMES.labels("canceled", code).inc()
        log.info("run canceled while its attempt ended", extra=fields(code=code))
        return True

    async def _queue(self, job: Job, traceparent: str | None) -> None:
        try:
            await self.broker.publish_job(job, traceparent=traceparent)
        except RunwireError as exc:
            # Postgres says queued; recovery re-publishes jobs that never reached the stream.
            log.warning("retry job not published yet, recovery will: %s", exc.message)
