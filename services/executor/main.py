"""The executor as a FastStream application: pull jobs, claim, run attempts, settle;
drain on SIGTERM. `faststream run runwire.executor.main:app`, `runwire-executor` or
`python -m runwire.executor`.

Cancel notices are a FastStream subscriber. The jobs consumer stays our own code
(`DurablePull` and `Executor.run`): it fetches only as many jobs as there are free
in-flight slots, so that a job is never held unstarted while its `ack_wait` runs, and
settles each with one decision (ack, nak with a delay, term) taken with Postgres after
the attempt; FastStream's pull subscriber fetches on its own schedule, acknowledges by
policy, and neither reconciles a durable consumer that exists nor notices one deleted.
"""

import asyncio
import logging
import os
import random
import socket
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from faststream import Path
from faststream.message import StreamMessage
from nats.aio.msg import Msg
from opentelemetry.trace import SpanKind
from pydantic import ValidationError

from runwire.contracts.errors import ErrorBody
from runwire.contracts.frames import Job
from runwire.contracts.status import RunStatus
from runwire.executor.attempt import AbortReason, Attempt, Outcome
from runwire.executor.outcome import Settler
from runwire.executor.runners import RUNNERS, Runner
from runwire.executor.runners.base import RunnerError
from runwire.runtime import publications, tracing
from runwire.runtime.app import Service
from runwire.runtime.broker import EXECUTOR_CONSUMER, Broker, StreamLimits
from runwire.runtime.consumer import DurablePull
from runwire.runtime.errors import RunwireError
from runwire.runtime.health import serve_health
from runwire.runtime.lifecycle import run
from runwire.runtime.logs import bind, fields
from runwire.runtime.metrics import ATTEMPT_DURATION, ATTEMPTS_IN_FLIGHT
from runwire.runtime.outbox import Outbox
from runwire.runtime.settings import ExecutorSettings
from runwire.runtime.store import Run, Store

log = logging.getLogger(__name__)

FETCH_BATCH = 64
# A job whose run waits for its session should not exist (such runs get their job when
# their turn comes); if one does, look again after this long.
SESSION_WAIT_S = 1.0


async def _unknown_runner(ctx: object) -> None:
    raise RunnerError("no runner of that name is registered on this executor", retryable=False)


class Executor:
    """Runs up to `max_in_flight` attempts at once; the consumer caps the global total."""

    def __init__(
        self,
        settings: ExecutorSettings,
        store: Store,
        broker: Broker,
        runners: dict[str, Runner] | None = None,
        outbox: Outbox | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.broker = broker
        self.runners = RUNNERS if runners is None else runners
        self.owner = settings.executor_id or (
            f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        )
        self.attempts: dict[str, Attempt] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._slot_freed = asyncio.Event()
        self._draining = False
        self.outbox = outbox or Outbox(store, broker)
        self._settler = Settler(store, self.outbox, settings, self.owner, random.Random())

    async def run(self, stop: asyncio.Event) -> None:
        """Fetch and run jobs until `stop`, then drain."""
        subjects = self.broker.subjects
        jobs = DurablePull(
            self.broker,
            subjects.jobs_stream,
            EXECUTOR_CONSUMER,
            limits=StreamLimits.of(self.settings),
            max_ack_pending=self.settings.max_in_flight,
            ack_wait_s=self.settings.ack_wait_ms / 1000,
        )
        await jobs.open()
        log.info("executor ready", extra=fields(owner=self.owner))
        try:
            while not stop.is_set():
                free = self.settings.max_in_flight - len(self._tasks)
                if free <= 0:
                    await self._wait_for_slot(stop)
                    continue
                msgs = await jobs.fetch(min(free, FETCH_BATCH), stop)
                if msgs is None:
                    break
                for msg in msgs:
                    task = asyncio.create_task(self._handle(msg))
                    self._tasks.add(task)
                    task.add_done_callback(self._done)
        finally:
            await self._drain()

    async def _wait_for_slot(self, stop: asyncio.Event) -> None:
        self._slot_freed.clear()
        waiters = {asyncio.create_task(self._slot_freed.wait()), asyncio.create_task(stop.wait())}
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for waiter in waiters:
            waiter.cancel()

    def _done(self, task: "asyncio.Task[None]") -> None:
        self._tasks.discard(task)
        self._slot_freed.set()

    async def _drain(self) -> None:
        self._draining = True
        if self.attempts:
            log.info("shutting down: returning %d attempts to the queue", len(self.attempts))
        for attempt in list(self.attempts.values()):
            attempt.abort(AbortReason.SHUTDOWN)
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=self.settings.drain_ms / 1000)
        await self.outbox.close()

    def on_cancel_notice(self, run_id: str) -> None:
        """Abort the run's attempt if it runs here (the notice goes to every executor)."""
        attempt = self.attempts.get(run_id)
        if attempt is not None:
            with bind(run_id=run_id):
                log.info("cancel notice: aborting the attempt")
            attempt.abort(AbortReason.CANCEL)

    async def _handle(self, msg: Msg) -> None:
        try:
            job = Job.model_validate_json(msg.data)
        except ValidationError as exc:
            log.error("malformed job dropped: %s", exc)
            await msg.term()
            return
        with bind(run_id=job.run_id, tenant=job.tenant):
            try:
                await self._run_job(job, msg)
            except RunwireError as exc:
                # Postgres or NATS away: the job comes back; the fence keeps it safe.
                log.warning("job not processed: %s", exc.message)
                await msg.nak(delay=1.0)
            except Exception:
                log.exception("job handling crashed")
                await msg.nak(delay=1.0)

    async def _run_job(self, job: Job, msg: Msg) -> None:
        # Claim and attempt belong to the run's trace, under whatever published the job
        # (the submit command, or a recovery decision).
        parent = tracing.context_from_headers(msg.headers)
        with tracing.span(
            "claim",
            parent,
            kind=SpanKind.CONSUMER,
            attributes=tracing.run_attributes(job.run_id, job.tenant, generation=job.generation),
        ) as claim:
            run = await self.store.claim(
                job.run_id, job.generation, self.owner, self.settings.lease_ttl_ms, msg.reply
            )
            claim.set_attribute("claimed", run is not None)
        if run is None:
            await self._not_claimed(job, msg)
            return
        with tracing.span(
            "attempt",
            parent or tracing.context_of(run.trace_parent),
            attributes=tracing.run_attributes(
                run.run_id, run.tenant, attempt=run.attempts, generation=run.generation
            ),
        ):
            await self._attempt(run, msg)

    async def _attempt(self, run: Run, msg: Msg) -> None:
        runner = self.runners.get(run.runner, _unknown_runner)
        attempt = Attempt(
            run,
            runner,
            store=self.store,
            broker=self.broker,
            settings=self.settings,
            owner=self.owner,
            on_heartbeat=msg.in_progress,
        )
        if self._draining:
            # Claimed while this executor is shutting down: hand it straight back.
            await self._settler.settle(attempt, Outcome(abort=AbortReason.SHUTDOWN), msg)
            return
        self.attempts[run.run_id] = attempt
        with bind(attempt=run.attempts, generation=run.generation):
            log.info("attempt started")
            ATTEMPTS_IN_FLIGHT.inc()
            started = time.monotonic()
            try:
                outcome = await attempt.execute()
            except RunwireError as exc:
                log.warning("attempt could not publish: %s", exc.message)
                outcome = Outcome(
                    error=ErrorBody(code=exc.code, message=exc.message, retryable=True)
                )
            finally:
                ATTEMPTS_IN_FLIGHT.dec()
                ATTEMPT_DURATION.observe(time.monotonic() - started)
                # Only this attempt: a newer one of the same run may be registered now.
                if self.attempts.get(run.run_id) is attempt:
                    del self.attempts[run.run_id]
            await self._settler.settle(attempt, outcome, msg)

    async def _not_claimed(self, job: Job, msg: Msg) -> None:
        """A job that did not start an attempt: stale, early, canceled or timed out (a
        run past its queue timeout is closed by recovery, the one place that does it)."""
        run = await self.store.get_run_by_id(job.run_id)
        waiting = (
            run is not None
            and run.status in (RunStatus.QUEUED, RunStatus.RECOVERING)
            and run.generation == job.generation
            and not run.cancel_requested
        )
        if run is None or not waiting:
            await msg.ack()  # duplicate, stale or already closed: nothing to do
            return
        assert run is not None
        now = datetime.now(UTC)
        if (
            run.attempts == 0
            and run.queue_timeout_ms is not None
            and (now - run.created_at).total_seconds() * 1000 >= run.queue_timeout_ms
        ):
            await msg.ack()  # past its queue timeout: recovery fails it on its next tick
            return
        delay = (run.not_before - now).total_seconds()
        if delay <= 0 and run.session_id is not None:
            # Due, yet not claimed: an earlier run of its session still holds the session.
            delay = SESSION_WAIT_S
        await msg.nak(delay=max(0.01, delay))


async def _run_id_of_notice(msg: StreamMessage[Any]) -> str:
    """A cancel notice's run id: its subject's last token (the body is empty). The
    handler gets it as its argument: the services' brokers inject nothing."""
    return str(msg.raw_message.subject).rsplit(".", 1)[-1]


class ExecutorService(Service[ExecutorSettings]):
    """Runs attempts; every executor hears the cancel notices."""

    name = "executor"
    executor: Executor

    def __init__(self, settings: ExecutorSettings, *, own_process: bool = True) -> None:
        super().__init__(settings, own_process=own_process)

        @self.faststream.subscriber(
            self.subjects.cancel_notice("{run_id}"),
            no_reply=True,
            title="ctl.cancel",
            decoder=_run_id_of_notice,
        )
        async def cancel_notice(run_id: str = Path()) -> None:
            """Internal. Core-NATS notice (empty body) from the submitter to executors:
            abort this run's attempt now. Best effort; the database is the fallback."""
            self.executor.on_cancel_notice(run_id)

        serve_health(self)
        publications.jobs(self)
        publications.raw_frames(self)

    def opened(self) -> None:
        self.executor = Executor(self.settings, self.store, self.broker, outbox=self.outbox)

    async def work(self, stop: asyncio.Event) -> None:
        await self.executor.run(stop)


service = ExecutorService(ExecutorSettings())
app = service.app


async def serve(settings: ExecutorSettings, stop: asyncio.Event) -> None:
    """Run attempts in this process until `stop` is set, then drain."""
    await ExecutorService(settings, own_process=False).serve(stop)


def main() -> None:
    run(service)
