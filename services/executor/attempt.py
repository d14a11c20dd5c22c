"""One attempt of a run: the runner, its heartbeat, its deadline and its abort signal.

The attempt owns a generation. Every frame it publishes and every write it makes is
tagged or guarded by that generation, so once the attempt is fenced out (its lease
lost to recovery) nothing it does takes effect.
"""

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace

from runwire.contracts.errors import ErrorBody, ErrorCode
from runwire.contracts.frames import Frame, FrameType
from runwire.executor.effects import EffectFence
from runwire.executor.ending import AbortReason, Outcome, attempt_error
from runwire.executor.frames import FrameSender
from runwire.executor.rate_limits import AttemptRates
from runwire.executor.resume import resume_point, resumes
from runwire.executor.waits import AttemptWaits
from runwire.runners.base import (
    AbortSignal,
    AttemptClosed,
    AttemptContext,
    Runner,
    RunnerError,
    RunnerSpec,
    ToolSpec,
    unexpected,
)
from runwire.runners.effects import EffectAdapter
from runwire.runtime import faults, tracing
from runwire.runtime.broker import Broker
from runwire.runtime.errors import (
    LostRace,
    PayloadTooLarge,
    RunwireError,
)
from runwire.runtime.outbox import Outbox
from runwire.runtime.settings import ExecutorSettings
from runwire.runtime.storable import storable, storable_text
from runwire.runtime.store import Run, Store

log = logging.getLogger(__name__)


class Attempt:
    """A claimed run being executed by this process."""

    def __init__(
        self,
        run: Run,
        runner: Runner,
        *,
        store: Store,
        broker: Broker,
        settings: ExecutorSettings,
        owner: str,
        on_heartbeat: Any = None,
        tools: Mapping[str, ToolSpec] | None = None,
        effects: Mapping[str, EffectAdapter] | None = None,
        outbox: Outbox | None = None,
    ) -> None:
        self.run = run
        self.generation = run.generation
        self._runner = runner
        self._tools = tools or {}
        self.waits = AttemptWaits(store, run.run_id, run.generation, self._emit, self._storable)
        self.rates = AttemptRates(store, outbox, run.run_id, owner)
        self._effects = EffectFence(
            store,
            effects or {},
            run_id=run.run_id,
            tenant=run.tenant,
            generation=run.generation,
            emit=self._emit,
            claim_ms=settings.effect_claim_ms,
            wait=self.waits.begin,
            pending_wait_s=settings.effect_pending_wait_s,
        )
        self._store = store
        self._broker = broker
        self._settings = settings
        self._owner = owner
        self._on_heartbeat = on_heartbeat
        self.continuation = run.partial_text
        # Where a resumed attempt continues: the frames stored for the run (contiguous
        # from seq 1) and the seq of the last of them (None for a fresh run).
        self.history: list[Frame] = []
        self.resume_after: int | None = None
        self.abort_signal = AbortSignal()
        self.abort_reason: AbortReason | None = None
        self.closed = False
        # Whether text the runner emitted had characters replaced (logged once).
        self._replaced = False
        # Made inside the attempt's span: its frames carry it, for the relay's spans.
        self._traceparent = tracing.current_traceparent()
        self.frames = FrameSender(
            broker,
            settings,
            tenant=run.tenant,
            run_id=run.run_id,
            generation=run.generation,
            traceparent=self._traceparent,
            on_fenced=lambda: self.abort(AbortReason.LOST),
        )

    @property
    def partial_text(self) -> str:
        """The run's text so far: what earlier attempts delivered plus this one's frames
        that are stored (call `sync` first for all of them)."""
        return self.continuation + self.frames.text.getvalue()

    @property
    def next_seq(self) -> int:
        """Where the frames that close this attempt start, in its own frames: after every
        one it sent (one it gave up on may have been stored after all)."""
        return self.frames.sent + 1

    def abort(self, reason: AbortReason) -> None:
        """Ask the runner to stop; the first reason that arrives is the one recorded."""
        if self.abort_reason is None:
            self.abort_reason = reason
        self.abort_signal.set()

    async def publish(self, type: FrameType, data: dict[str, Any]) -> None:
        """Publish a frame of this attempt (its `data` must fit the type's model): queued
        at once, sent in order once the frame before it is stored (see `frames`); once
        the attempt is closed, each one is waited for."""
        self.frames.put(type, self._storable(type.value, data), self._coalescing())
        if self.closed:
            await self.sync()
        else:
            await self.frames.room()

    def _storable(self, what: str, value: Any) -> Any:
        """`value` with the characters Postgres cannot store replaced (see
        `runwire.runtime.storable`): the frame a follower sees now is the one stored."""
        clean = storable(value)
        if clean is not value and not self._replaced:
            self._replaced = True  # once per attempt: a stream of them is one problem
            log.warning(
                "the runner's %s held a NUL character or a lone surrogate, which Postgres "
                "cannot store; replaced with U+FFFD (and in any later frame)",
                what,
            )
        return clean

    def _coalescing(self) -> bool:
        return self._settings.coalesce_text and not self.closed

    async def sync(self) -> None:
        """Wait until every frame published so far is stored, in order."""
        await self.frames.sync()

    async def _emit(self, type: FrameType, data: dict[str, Any]) -> None:
        if self.closed or self.abort_reason == AbortReason.LOST:
            raise AttemptClosed(f"attempt {self.generation} of run {self.run.run_id} is closed")
        if self.frames.emitted >= self._settings.max_frames_per_run:
            # For good: a run that emits without end must not fill the stream and Postgres.
            raise PayloadTooLarge(
                f"the run emitted {self.frames.emitted} frames, the limit of a run "
                f"(RUNWIRE_MAX_FRAMES_PER_RUN={self._settings.max_frames_per_run})"
            )
        await self.publish(type, data)

    async def _checkpoint(self, state: Any) -> None:
        if self.closed:
            raise AttemptClosed(f"attempt {self.generation} of run {self.run.run_id} is closed")
        state = self._storable("checkpoint", state)
        await self.publish(FrameType.CHECKPOINT, {"state": state})
        await self.sync()  # the text saved with the checkpoint must be in the stream
        try:
            await self._store.save_checkpoint(
                self.run.run_id, self.generation, state, self.partial_text
            )
        except LostRace:
            self.abort(AbortReason.LOST)
            raise AttemptClosed("lease lost") from None

    def _budget_key(self, key: str) -> str:
        # Per attempt: a reservation of an attempt that is gone is charged by recovery,
        # never settled by the next one.
        return f"g{self.generation}:{key}"

    async def _reserve(self, key: str, tokens: int, cost: int) -> None:
        try:
            grant = await self._store.budget_reserve(
                self.run.run_id,
                self._budget_key(key),
                max(0, tokens),
                max(0, cost),
                self.generation,
            )
        except LostRace:
            self.abort(AbortReason.LOST)
            raise AttemptClosed("lease lost") from None
        if not grant.granted:
            needs = f"{tokens} tokens" + (f" and {cost} cost units" if cost else "")
            raise RunnerError(
                f"{key} needs {needs} of budget; {grant.shortfall()}",
                retryable=False,
                code=ErrorCode.BUDGET_EXCEEDED,
            )

    async def _settle(self, key: str, used: int, receipt: str | None, cost: int) -> None:
        await faults.point(faults.BUDGET_UNSETTLED)
        await self._store.budget_settle(
            self.run.run_id, self._budget_key(key), max(0, used), receipt, max(0, cost)
        )

    async def _pinned(self) -> ErrorBody | None:
        """MODEL_CHANGED when the run's pinned configuration is not this attempt's; pins
        it when the run has none yet."""
        spec = self._runner
        if not isinstance(spec, RunnerSpec) or spec.pin is None:
            return None
        try:
            pin = spec.pin(self.run.input)
        except Exception as exc:
            log.error("the runner's pin raised %s", type(exc).__name__, exc_info=exc)
            return ErrorBody(
                code=ErrorCode.RUNNER_FATAL,
                message=(
                    f"the runner's configuration cannot be read ({type(exc).__name__}); "
                    "the executor logged the details with the run_id"
                ),
                retryable=False,
            )
        if self.run.config_pin is None:
            await self._store.pin_config(self.run.run_id, self.generation, pin)
            return None
        if pin == self.run.config_pin:
            return None
        return ErrorBody(
            code=ErrorCode.MODEL_CHANGED,
            message=(
                f"the run was pinned to configuration {self.run.config_pin[:12]}, but this "
                f"attempt would run with {pin[:12]} (model, base URL or sampling settings "
                "changed); submit a new run to use the new configuration"
            ),
            retryable=False,
        )

    async def _resume_point(self) -> None:
        """Continue from everything the relay stored for the run (see `resume`)."""
        if not resumes(self.run):
            return
        point = await resume_point(self._store, self.run, self._settings.resume_wait_ms)
        self.history = point.history
        self.continuation = point.continuation
        self.resume_after = point.after

    async def execute(self) -> Outcome:
        """Run the runner under heartbeat, deadline and abort; return how it ended."""
        changed = await self._pinned()
        if changed is not None:
            return Outcome(error=changed)
        await self._resume_point()
        resumed = self.resume_after is not None
        started: dict[str, Any] = {
            "attempt": self.run.attempts,
            "resumed": resumed,
            "partial_length": len(self.continuation),
        }
        if resumed:
            started["resume_after"] = self.resume_after
        await self.frames.start(self.run.last_seq, fresh=not resumes(self.run))
        await self.publish(FrameType.RUN, started)
        ctx = AttemptContext(
            run_id=self.run.run_id,
            tenant=self.run.tenant,
            input=self.run.input,
            attempt=self.run.attempts,
            resumed=resumed,
            continuation=self.continuation,
            checkpoint_state=self.run.checkpoint,
            history=self.history,
            abort=self.abort_signal,
            _emit=self._emit,
            _checkpoint=self._checkpoint,
            tools=self._tools,
            _effect=self._effects.run,
            _reserve=self._reserve,
            _settle=self._settle,
            _wait=self.waits.begin,
            durable_sleep_s=self._settings.durable_sleep_s,
            _take_rate=self.rates.take,
            _settle_rate=self.rates.settle,
            _observe_rate=self.rates.observe,
        )
        runner_span = tracing.tracer.start_span(
            "runner", attributes={**self._span_attributes(), "runner": self.run.runner}
        )
        with trace.use_span(runner_span, end_on_exit=False):
            runner_task: asyncio.Task[dict[str, Any] | None] = asyncio.create_task(
                self._runner(ctx)
            )
        tracing.end_with_task(runner_span, runner_task)
        heartbeat = asyncio.create_task(self._heartbeat())
        aborted = asyncio.create_task(self.abort_signal.wait())
        try:
            done, _ = await asyncio.wait(
                {runner_task, aborted},
                timeout=self.run.attempt_timeout_ms / 1000,
                return_when=asyncio.FIRST_COMPLETED,
            )
            if runner_task not in done:
                if not self.abort_signal.is_set():
                    self.abort(AbortReason.TIMEOUT)
                # Give the runner a short grace to stop by itself, then abandon it.
                await asyncio.wait({runner_task}, timeout=self._settings.abort_grace_ms / 1000)
            try:
                await self.sync()
            except LostRace:
                return Outcome(abort=AbortReason.LOST)  # fenced out: a newer attempt goes on
            except RunwireError as exc:
                return Outcome(error=attempt_error(exc, exc.retryable))
            return self._outcome(runner_task)
        finally:
            self.closed = True
            await self.frames.close()
            heartbeat.cancel()
            aborted.cancel()
            if not runner_task.done():
                log.warning("runner did not stop after abort; abandoning it")
                runner_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat

    def _outcome(self, task: "asyncio.Task[dict[str, Any] | None]") -> Outcome:
        # An abort wins: a runner that returns after its abort did not finish its work.
        if self.abort_reason is not None:
            return Outcome(abort=self.abort_reason)
        if self.waits.waiting_on is not None:
            return Outcome(wait=self.waits.waiting_on)
        if self.rates.waiting is not None:
            return Outcome(limited=self.rates.waiting)
        exc = task.exception()
        if exc is None:
            return Outcome(result=self._storable("result", task.result() or {}))
        if isinstance(exc, RunnerError):
            wait = exc.retry_after_s
            message = storable_text(exc.message)
            return Outcome(
                error=ErrorBody(code=exc.code, message=message, retryable=exc.retryable),
                retry_after_ms=None if wait is None else max(0, round(wait * 1000)),
            )
        if isinstance(exc, AttemptClosed):
            return Outcome(abort=self.abort_reason or AbortReason.LOST)
        if isinstance(exc, RunwireError):
            return Outcome(error=attempt_error(exc, exc.retryable))
        log.error("runner raised %s", type(exc).__name__, exc_info=exc)
        return Outcome(
            error=ErrorBody(
                code=ErrorCode.RUNNER_ERROR, message=unexpected("runner", exc), retryable=True
            )
        )

    def _span_attributes(self) -> dict[str, Any]:
        return tracing.run_attributes(
            self.run.run_id, self.run.tenant, attempt=self.run.attempts, generation=self.generation
        )

    def _heartbeat_failed(self, reason: str) -> None:
        """A span in the run's trace for a lease renewal or cancel check that failed."""
        with tracing.span(
            "heartbeat failure", attributes={**self._span_attributes(), "reason": reason}
        ) as current:
            tracing.failed(current, reason)

    async def _heartbeat(self) -> None:
        """Renew the lease every `heartbeat_ms`; between renewals, poll for a cancel
        every `cancel_poll_ms` (the fallback when the cancel notice is lost)."""
        loop = asyncio.get_running_loop()
        every = self._settings.heartbeat_ms / 1000
        tick = min(every, self._settings.cancel_poll_ms / 1000)
        next_renewal = loop.time() + every
        while True:
            # On the tick's grid of the loop's clock: the attempts of this executor wake
            # together, and their renewals (or polls) go to Postgres as one statement.
            await asyncio.sleep(tick - loop.time() % tick)
            renew = loop.time() >= next_renewal - tick / 2
            try:
                if renew:
                    next_renewal = loop.time() + every
                    if self._on_heartbeat is not None:
                        await self._on_heartbeat()
                    # The text saved is what is stored so far (frames on their way are
                    # not waited for: a runner that streams on would hold it up).
                    cancel = await self._store.heartbeat(
                        self.run.run_id,
                        self.generation,
                        self._settings.lease_ttl_ms,
                        self.partial_text,
                    )
                else:
                    cancel = await self._store.cancel_requested(self.run.run_id, self.generation)
            except LostRace:
                log.warning("lease lost to a newer attempt; stopping")
                self._heartbeat_failed("lease lost to a newer attempt")
                self.abort(AbortReason.LOST)
                return
            except RunwireError as exc:
                # Postgres is away: keep going; if the lease expires, recovery takes over
                # and the fence stops every later write of this attempt.
                log.warning("heartbeat not recorded: %s", exc.message)
                self._heartbeat_failed(exc.message)
                continue
            except Exception as exc:
                log.exception("heartbeat failed")
                self._heartbeat_failed(f"{type(exc).__name__}: {exc}")
                continue
            if cancel:
                self.abort(AbortReason.CANCEL)
