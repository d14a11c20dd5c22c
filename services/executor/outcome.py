"""The one place that maps an attempt's outcome to Postgres and to JetStream.

- finished → finish + ack;
- retryable error with attempts left → requeue with backoff + ack (the job waits in the
  outbox until due, so it holds no slot of the in-flight limit meanwhile);
- fatal or exhausted → fail + term;
- canceled → cancel (with the error the canceller chose: CANCELED or SUPERSEDED) + ack;
- shutdown → hand back (not counted) + ack;
- a model call without room under a rate limit → back to the queue until room comes
  (not counted) + ack;
- lease lost → ack only (the newer attempt owns the run).

Each write also writes, in its transaction, what it implies (Postgres builds it: the
`error` and `done` frames after the attempt's own, the next job, the next run of the
session, the run event); the outbox publishes that right after the commit. A cancel
that arrives while an attempt ends closes the run as canceled instead.
"""

import logging
import random
from dataclasses import dataclass
from enum import StrEnum

from nats.aio.msg import Msg

from runwire.contracts.errors import ErrorBody, ErrorCode
from runwire.contracts.status import RunStatus
from runwire.executor.attempt import Attempt
from runwire.executor.ending import AbortReason, Outcome
from runwire.runtime import faults, tracing
from runwire.runtime.errors import CANCELED_ERROR, LostRace
from runwire.runtime.logs import fields
from runwire.runtime.metrics import ATTEMPT_OUTCOMES, RETRIES
from runwire.runtime.outbox import Outbox
from runwire.runtime.settings import ExecutorSettings
from runwire.runtime.store import Run, Store

log = logging.getLogger(__name__)


class Decision(StrEnum):
    """What the executor made of an attempt's outcome (the `decision` of its span and of
    the attempt outcome metric)."""

    FINISHED = "finished"
    RETRY = "retry"  # back to the queue after a backoff
    FAILED = "failed"  # for good: fatal, or no attempts left
    CANCELED = "canceled"
    HANDED_BACK = "handed_back"  # to the queue, for a shutdown: not counted as an attempt
    LOST = "lost"  # a newer attempt owns the run: nothing written
    WAITING = "waiting"  # the run waits for an answer: not counted as an attempt
    # back to the queue until a rate limit has room: not counted as an attempt
    RATE_LIMITED = "rate_limited"

    @property
    def coded(self) -> bool:
        """Whether its outcome metric names the run's error code."""
        return self in (Decision.CANCELED, Decision.RETRY, Decision.FAILED)


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
    outbox: Outbox
    settings: ExecutorSettings
    owner: str
    rng: random.Random

    async def settle(self, attempt: Attempt, outcome: Outcome, msg: Msg) -> None:
        """Write the outcome (fenced by generation), publish what it implies, ack the job."""
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
                ended, decision = await self._settle(attempt, outcome)
            except LostRace:
                log.warning("outcome not recorded: a newer attempt owns the run")
                ended, decision = None, Decision.LOST
            current.set_attribute("decision", decision.value)
            if outcome.error is not None:
                current.set_attribute("code", outcome.error.code.value)
            if run.parent_run_id is not None and ended is not None:
                await faults.point(faults.NODE_SETTLED)
            if ended is not None and attempt.frames.tail.generation == attempt.generation:
                # Its closing frames follow the attempt's last: no need to ask the stream.
                self.outbox.expect_tail(run.run_id, attempt.frames.tail)
            await self.outbox.dispatch(ended)
        if decision == Decision.FAILED:
            await msg.term()
        else:
            await msg.ack()
        ATTEMPT_OUTCOMES.labels(decision.value, _code(ended) if decision.coded else "none").inc()

    async def _settle(self, attempt: Attempt, outcome: Outcome) -> tuple[Run | None, Decision]:
        """Record the outcome; returns the run as written and the decision."""
        run, gen, text = attempt.run, attempt.generation, attempt.partial_text
        close_seq = attempt.next_seq
        # This decision's span: the parent of what the write implies (the next job, `done`).
        traceparent = tracing.current_traceparent()
        if outcome.result is not None:
            ended = await self.store.finish(
                run.run_id,
                gen,
                {"text": text, **outcome.result},
                text,
                self.owner,
                close_seq,
                traceparent,
            )
            log.info("run finished", extra=fields(attempt=run.attempts))
            return ended, Decision.FINISHED
        if outcome.abort == AbortReason.LOST:
            return None, Decision.LOST
        if outcome.abort == AbortReason.CANCEL:
            ended = await self.store.cancel_attempt(
                run.run_id, gen, CANCELED_ERROR, text, self.owner, close_seq, traceparent
            )
            log.info("run canceled", extra=fields(attempt=run.attempts, code=_code(ended)))
            return ended, Decision.CANCELED
        if outcome.abort == AbortReason.SHUTDOWN:
            ended = await self.store.hand_back(
                run.run_id, gen, text, self.owner, close_seq, traceparent
            )
            if ended.status == RunStatus.CANCELED:
                log.info("run canceled while its attempt ended", extra=fields(code=_code(ended)))
                return ended, Decision.CANCELED
            log.info("attempt returned to the queue for shutdown")
            return ended, Decision.HANDED_BACK
        if outcome.wait is not None:
            ended = await self.store.enter_waiting(
                run.run_id, gen, outcome.wait, text, self.owner, close_seq, traceparent
            )
            if ended.status == RunStatus.CANCELED:
                log.info("run canceled while its attempt ended", extra=fields(code=_code(ended)))
                return ended, Decision.CANCELED
            log.info("run waits", extra=fields(wait_id=outcome.wait, status=ended.status))
            return ended, Decision.WAITING
        if outcome.limited is not None:
            until, limit = outcome.limited
            ended = await self.store.rate_wait(
                run.run_id, gen, until, limit, text, self.owner, close_seq, traceparent
            )
            if ended.status == RunStatus.CANCELED:
                log.info("run canceled while its attempt ended", extra=fields(code=_code(ended)))
                return ended, Decision.CANCELED
            log.info("run waits for room under a rate limit", extra=fields(limit=limit))
            return ended, Decision.RATE_LIMITED
        error = outcome.error or timeout_error(run.attempt_timeout_ms)
        # An attempt that ended to wait does not count.
        if error.retryable and run.attempts - run.waits < run.max_attempts:
            # A workflow node's own backoff, or the executor's.
            base = self.settings.retry_base_ms if run.retry_base_ms is None else run.retry_base_ms
            delay = backoff_ms(run.attempts, base, max(base, self.settings.retry_max_ms), self.rng)
            if outcome.retry_after_ms is not None:
                delay = max(delay, outcome.retry_after_ms)
            ended = await self.store.requeue(
                run.run_id,
                gen,
                error,
                text,
                delay,
                self.owner,
                close_seq,
                traceparent,
            )
            if ended.status == RunStatus.CANCELED:
                log.info("run canceled while its attempt ended", extra=fields(code=_code(ended)))
                return ended, Decision.CANCELED
            RETRIES.labels(error.code.value).inc()
            log.info(
                "attempt failed; retrying",
                extra=fields(attempt=run.attempts, code=error.code, delay_ms=delay),
            )
            return ended, Decision.RETRY
        ended = await self.store.close_attempt(
            run.run_id, gen, RunStatus.FAILED, error, text, self.owner, close_seq, traceparent
        )
        log.info("run failed", extra=fields(attempt=run.attempts, code=error.code))
        return ended, Decision.FAILED


def _code(run: Run | None) -> str:
    error = run.error if run is not None else None
    return (error.code if error is not None else ErrorCode.CANCELED).value
