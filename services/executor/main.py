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
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from faststream import Path
from faststream.message import StreamMessage
from nats.aio.msg import Msg
from opentelemetry.trace import SpanKind
from pydantic import ValidationError

from runwire.contracts.frames import Job
from runwire.contracts.status import RunStatus
from runwire.executor.attempt import Attempt
from runwire.executor.ended_effects import EndedEffects
from runwire.executor.ending import AbortReason, Outcome, attempt_error
from runwire.executor.isolation import IsolatedRunner, isolated
from runwire.executor.outcome import Settler
from runwire.executor.presence import Presence
from runwire.runners.base import Runner, RunnerError, RunnerSpec, ToolSpec
from runwire.runners.effects import EffectAdapter, load_effects
from runwire.runners.outbound import OutboundGuard
from runwire.runners.registry import RunnerConfigError, input_schema, load_runners
from runwire.runners.tools import load_tools
from runwire.runtime import faults, publications, tracing
from runwire.runtime.app import Service
from runwire.runtime.broker import Broker
from runwire.runtime.commands import describe
from runwire.runtime.consumer import DurablePull
from runwire.runtime.errors import LostRace, RunwireError
from runwire.runtime.health import serve_health
from runwire.runtime.lifecycle import CannotStart, run
from runwire.runtime.logs import bind, fields
from runwire.runtime.metrics import ATTEMPT_DURATION, ATTEMPTS_IN_FLIGHT
from runwire.runtime.outbox import Outbox
from runwire.runtime.settings import ExecutorSettings, from_env
from runwire.runtime.store import Run, Store
from runwire.runtime.streams import EXECUTOR_CONSUMER, StreamLimits

log = logging.getLogger(__name__)

FETCH_BATCH = 64
# A job whose run waits for its session should not exist (such runs get their job when
# their turn comes); if one does, look again after this long.
SESSION_WAIT_S = 1.0
# A job whose handling crashed (a bug, not Postgres or NATS away) this many times is
# terminated, so that it cannot hold a slot of the consumer for ever.
POISON_DELIVERIES = 5


async def _unknown_runner(ctx: object) -> None:
    raise RunnerError("no runner of that name is registered on this executor", retryable=False)


def executor_consumer(runner: str) -> str:
    """The durable consumer that the executors of one runner share."""
    return f"{EXECUTOR_CONSUMER}-{runner}"


class Executor:
    """Runs the jobs of its runners: per runner, up to its `max_in_flight` (or the
    executor's) attempts at once, a cap its consumer also holds over all executors."""

    def __init__(
        self,
        settings: ExecutorSettings,
        store: Store,
        broker: Broker,
        runners: Mapping[str, RunnerSpec],
        outbox: Outbox | None = None,
        tools: Mapping[str, ToolSpec] | None = None,
        effects: Mapping[str, EffectAdapter] | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.broker = broker
        self.runners = dict(runners)
        self.tools = dict(tools or {})
        self.effects = dict(effects or {})
        self.owner = settings.executor_id or (
            f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        )
        self.attempts: dict[str, Attempt] = {}
        # Its consumers are open and its runners recorded: it takes their jobs now.
        self.ready = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._draining = False
        self.outbox = outbox or Outbox(store, broker)
        self._settler = Settler(store, self.outbox, settings, self.owner, random.Random())
        self.presence = Presence(settings.database_url, settings.heartbeat_ms / 1000)
        self._ended_effects = EndedEffects(
            store, self.effects, every_ms=settings.effect_reconcile_ms, actor=self.owner
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Fetch and run jobs of every runner until `stop`, then drain."""
        subjects = self.broker.subjects
        limits = StreamLimits.of(self.settings)
        # The one consumer of every runner that executors before per-runner jobs shared:
        # on a work-queue stream it would overlap the per-runner ones.
        if await self.broker.delete_consumer(subjects.jobs_stream, EXECUTOR_CONSUMER):
            log.info("removed the jobs consumer of executors before per-runner jobs")
        pulls: dict[str, tuple[DurablePull, int]] = {}
        for name, spec in self.runners.items():
            cap = spec.max_in_flight or self.settings.max_in_flight
            pulls[name] = (
                DurablePull(
                    self.broker,
                    subjects.jobs_stream,
                    executor_consumer(name),
                    limits=limits,
                    max_ack_pending=cap,
                    ack_wait_s=self.settings.ack_wait_ms / 1000,
                    filter_subject=subjects.jobs_of(name),
                    declare_streams=False,
                ),
                cap,
            )
        for pull, _ in pulls.values():
            await pull.open()
        await self.presence.hold()
        await self.store.register_runners(
            {name: input_schema(spec) for name, spec in self.runners.items()}, self.owner
        )
        self.ready = True
        log.info(
            "executor ready",
            extra=fields(owner=self.owner, runners=sorted(self.runners)),
        )
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self.presence.run(stop), name="presence")
                group.create_task(self._ended_effects.watch(stop), name="ended-effects")
                for name, (pull, cap) in pulls.items():
                    group.create_task(self._serve(name, pull, cap, stop), name=f"jobs-{name}")
        finally:
            try:
                await self._drain()
            finally:
                # Last: while it is held, recovery leaves the draining attempts alone.
                await self.presence.close()

    async def _serve(self, runner: str, jobs: DurablePull, cap: int, stop: asyncio.Event) -> None:
        """Fetch one runner's jobs, at most `cap` attempts of it at once, until `stop`."""
        running: set[asyncio.Task[None]] = set()
        freed = asyncio.Event()

        def done(task: "asyncio.Task[None]") -> None:
            running.discard(task)
            freed.set()

        while not stop.is_set():
            free = cap - len(running)
            if free <= 0:
                freed.clear()
                await self._wait_for(freed, stop)
                continue
            msgs = await jobs.fetch(min(free, FETCH_BATCH), stop)
            if msgs is None:
                break
            for msg in msgs:
                task = asyncio.create_task(self._handle(msg))
                self._tasks.add(task)
                running.add(task)
                task.add_done_callback(self._tasks.discard)
                task.add_done_callback(done)

    @staticmethod
    async def _wait_for(freed: asyncio.Event, stop: asyncio.Event) -> None:
        waiters = {asyncio.create_task(freed.wait()), asyncio.create_task(stop.wait())}
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for waiter in waiters:
            waiter.cancel()

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
        """Abort the run's attempt if it runs here (the notice goes to every executor) and
        Postgres says its cancel was requested: a notice alone is never believed (only
        the submitter may send one, but a second line costs one batched query)."""
        attempt = self.attempts.get(run_id)
        if attempt is not None:
            task = asyncio.create_task(self._cancel_if_requested(attempt))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _cancel_if_requested(self, attempt: Attempt) -> None:
        run_id = attempt.run.run_id
        with bind(run_id=run_id):
            try:
                requested = await self.store.cancel_requested(run_id, attempt.generation)
            except LostRace:
                return  # fenced out: its own heartbeat ends it
            except RunwireError as exc:
                log.warning("cancel notice not checked (%s); the attempt's poll will", exc)
                return
            if not requested:
                log.warning("cancel notice for a run whose cancel was not requested: ignored")
                return
            log.info("cancel notice: aborting the attempt")
            attempt.abort(AbortReason.CANCEL)

    async def _handle(self, msg: Msg) -> None:
        try:
            job = Job.model_validate_json(msg.data)
        except ValidationError as exc:
            # Never left pending: a job that is not one would be redelivered forever and
            # hold a slot of the consumer's max_ack_pending each time.
            log.error(
                "malformed job terminated: %s", describe(exc), extra=fields(subject=msg.subject)
            )
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
                if msg.metadata.num_delivered >= POISON_DELIVERIES:
                    log.exception(
                        "job handling crashed %d times: job terminated", POISON_DELIVERIES
                    )
                    await msg.term()
                    return
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
                job.run_id,
                job.generation,
                self.owner,
                self.settings.lease_ttl_ms,
                msg.reply,
                self.presence.held,
            )
            claim.set_attribute("claimed", run is not None)
        if run is None:
            await self._not_claimed(job, msg)
            return
        if run.parent_run_id is not None:
            # A node run's claim started its node: the `node` frame waits in the outbox.
            await faults.point(faults.NODE_CLAIMED)
            await self.outbox.dispatch(run)
        with tracing.span(
            "attempt",
            parent or tracing.context_of(run.trace_parent),
            attributes=tracing.run_attributes(
                run.run_id, run.tenant, attempt=run.attempts, generation=run.generation
            ),
        ):
            await self._attempt(run, msg)

    async def _attempt(self, run: Run, msg: Msg) -> None:
        runner: Runner = self.runners.get(run.runner, _unknown_runner)
        if run.runner in self.runners and isolated(self.settings.isolated_runners, run.runner):
            runner = IsolatedRunner(
                run.runner,
                runners=self.settings.runners,
                tools=self.settings.tools,
            )
        attempt = Attempt(
            run,
            runner,
            store=self.store,
            broker=self.broker,
            settings=self.settings,
            owner=self.owner,
            on_heartbeat=msg.in_progress,
            tools=self.tools,
            effects=self.effects,
            outbox=self.outbox,
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
                outcome = Outcome(error=attempt_error(exc, retryable=True))
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
        if run is None or run.tenant != job.tenant or run.runner != job.runner:
            log.error("a job that names no run of its tenant and runner terminated")
            await msg.term()
            return
        waiting = (
            run is not None
            and run.status in (RunStatus.QUEUED, RunStatus.RECOVERING)
            and run.generation == job.generation
            and not run.cancel_requested
        )
        if not waiting:
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

    def __init__(
        self,
        settings: ExecutorSettings,
        *,
        own_process: bool = True,
        runners: Mapping[str, object] | None = None,
        tools: Mapping[str, object] | None = None,
    ) -> None:
        super().__init__(settings, own_process=own_process)
        self._given_runners = runners
        self._given_tools = tools
        self.runners: dict[str, RunnerSpec] = {}
        self.tools: dict[str, ToolSpec] = {}
        self.effects: dict[str, EffectAdapter] = {}

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
        publications.frames_out(self)

    def prepare(self) -> None:
        try:
            guard = OutboundGuard.parse(
                self.settings.effect_http_allow_hosts, self.settings.effect_http_allow_networks
            )
        except ValueError as exc:
            raise CannotStart(str(exc)) from exc
        try:
            self.runners = load_runners(self.settings.runners, self._given_runners)
            self.tools = load_tools(self.settings.tools, self._given_tools)
            self.effects = load_effects(guard=guard)
        except RunnerConfigError as exc:
            raise CannotStart(str(exc)) from exc
        if not self.runners:
            raise CannotStart("no runner is registered: this executor would take no job")
        given_only = sorted(
            name
            for name in (self._given_runners or {})
            if isolated(self.settings.isolated_runners, name)
        )
        if given_only:
            raise CannotStart(
                f"runners {', '.join(given_only)} are given in code and cannot run in a "
                "process of their own (RUNWIRE_ISOLATED_RUNNERS): name them in "
                "RUNWIRE_RUNNERS or as entry points"
            )

    def runner_names(self) -> list[str]:
        # Only once it takes their jobs (and the submitters can know them): a health
        # reply that lists a runner is a promise that its runs are served.
        executor = getattr(self, "executor", None)
        return sorted(self.runners) if executor is not None and executor.ready else []

    def loaded_runners(self) -> list[str]:
        return sorted(self.runners)

    def opened(self) -> None:
        self.executor = Executor(
            self.settings,
            self.store,
            self.broker,
            self.runners,
            self.outbox,
            self.tools,
            self.effects,
        )

    async def work(self, stop: asyncio.Event) -> None:
        await self.executor.run(stop)


service = ExecutorService(from_env(ExecutorSettings))
app = service.app


async def serve(
    settings: ExecutorSettings,
    stop: asyncio.Event,
    runners: Mapping[str, object] | None = None,
    tools: Mapping[str, object] | None = None,
) -> None:
    """Run attempts in this process until `stop` is set, then drain; `runners` and
    `tools` are registered beside those the entry points and the settings name."""
    await ExecutorService(settings, own_process=False, runners=runners, tools=tools).serve(stop)


def main() -> None:
    run(service)
