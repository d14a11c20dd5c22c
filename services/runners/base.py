"""The runner interface: what one attempt of a run receives and may do.

A runner is an async callable taking an `AttemptContext` and returning an optional
result dict. It fails by raising `RunnerError(retryable=...)`; it should stop soon
after `ctx.abort` is set (cancel, deadline, shutdown), or it is abandoned. `runner()`
declares one with what the services need to know about it: the model its input must
fit (checked by the submitter) and how many of its attempts may run at once.
"""

import asyncio
import contextlib
import inspect
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from runwire.contracts.errors import ErrorCode
from runwire.contracts.frames import Frame, FrameType, WaitKind

log = logging.getLogger(__name__)


class RunnerError(Exception):
    """A runner's failure; `retryable` decides between a retry and failing the run.

    `retry_after_s`: the next attempt starts no sooner (a provider's `Retry-After`), even
    when the executor's backoff is shorter. `code`: the run's error code when it fails
    (by default RUNNER_ERROR for a retryable failure, RUNNER_FATAL otherwise).
    """

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        retry_after_s: float | None = None,
        code: ErrorCode | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable
        self.retry_after_s = retry_after_s
        self.code = code or (ErrorCode.RUNNER_ERROR if retryable else ErrorCode.RUNNER_FATAL)


def unexpected(what: str, exc: BaseException) -> str:
    """What a client reads of an exception that `what` (the runner, a tool) did not
    raise on purpose: its class, never its text, which may hold whatever the code had in
    hand (a key in a URL, a DSN, a provider's answer). The executor's log keeps it whole,
    with the run_id."""
    return (
        f"the {what} failed unexpectedly ({type(exc).__name__}); the executor logged the "
        "details with the run_id"
    )


class AttemptClosed(Exception):
    """Raised by `emit` once the attempt has been closed: nothing it does counts now."""


class Waiting(AttemptClosed):
    """Raised by a wait that is not answered yet: the attempt ends here, and the run
    waits (no worker held); its next attempt, once the wait is decided, runs the runner
    again from its checkpoint, and the same wait then returns at once."""


class RateLimited(AttemptClosed):
    """Raised by `take_rate` when a rate limit has no room for the call: the attempt ends
    here, and the run waits in the queue (no worker held) until room comes; its next
    attempt runs the runner again, and the same call then gets its room at once."""


class WaitTimeout(RunnerError):
    """A wait ran past its timeout without an answer. Uncaught, the run fails with
    WAIT_TIMEOUT (not retryable)."""

    def __init__(self, message: str, *, wait_id: str = "") -> None:
        super().__init__(message, retryable=False, code=ErrorCode.WAIT_TIMEOUT)
        self.wait_id = wait_id


@dataclass(frozen=True)
class ToolOutcome:
    """What a tool call gave: `output`, or `error` when it failed."""

    id: str
    name: str
    output: Any
    error: str | None


@dataclass(frozen=True)
class ToolContext:
    """What a tool's call may know and do, for a tool that takes it as its second
    parameter: the run and the call, and side effects and budget reservations named
    within the call (`key` is prefixed with the call's id, so two calls of one tool in a
    run are two actions, while the same call asked again after a crash is the same)."""

    run_id: str
    tenant: str
    call_id: str
    _attempt: "AttemptContext"

    def _key(self, key: str) -> str:
        return f"{self.call_id}:{key}"

    async def effect(
        self, kind: str, key: str, request: dict[str, Any], *, tokens: int = 0, cost: int = 0
    ) -> dict[str, Any]:
        """`AttemptContext.effect`, for this call: performed once, whatever crashes."""
        return await self._attempt.effect(kind, self._key(key), request, tokens=tokens, cost=cost)

    async def reserve(self, key: str, tokens: int = 0, *, cost: int = 0) -> None:
        """`AttemptContext.reserve`, for this call."""
        await self._attempt.reserve(self._key(key), tokens, cost=cost)

    async def settle(
        self, key: str, tokens: int = 0, receipt: str | None = None, *, cost: int = 0
    ) -> None:
        """`AttemptContext.settle`, for this call."""
        await self._attempt.settle(self._key(key), tokens, receipt, cost=cost)


def _wake(waiter: "asyncio.Future[None]") -> None:
    if not waiter.done():
        waiter.set_result(None)


class AbortSignal(asyncio.Event):
    """An attempt's abort event, whose `sleep` costs a timer, not a task: a runner that
    paces its tokens sleeps once per token."""

    def __init__(self) -> None:
        super().__init__()
        self._sleepers: set[asyncio.Future[None]] = set()

    def set(self) -> None:
        super().set()
        for waiter in self._sleepers:
            _wake(waiter)

    async def sleep(self, seconds: float) -> None:
        """Sleep up to `seconds`; return at once when the event is set."""
        if self.is_set():
            return
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        timer = loop.call_later(max(0.0, seconds), _wake, waiter)
        self._sleepers.add(waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._sleepers.discard(waiter)


ToolFunction = Callable[..., Awaitable[Any]]


class ToolError(Exception):
    """A tool's failure, reported to the runner (and the model) as the call's `error`."""


@dataclass(frozen=True)
class ToolSpec:
    """A tool with what a model needs to call it."""

    run: ToolFunction
    input_model: type[BaseModel]
    description: str
    # The function takes a ToolContext after its arguments.
    takes_context: bool = False

    def schema(self) -> dict[str, Any]:
        """The JSON Schema of the tool's arguments."""
        return self.input_model.model_json_schema()

    async def call(self, arguments: dict[str, Any], ctx: "ToolContext | None" = None) -> Any:
        """Run the tool; bad arguments and its own failures raise ToolError."""
        try:
            args = self.input_model.model_validate(arguments)
        except ValidationError as exc:
            raise ToolError(f"invalid arguments: {exc.errors(include_url=False)}") from exc
        if self.takes_context:
            if ctx is None:
                raise ToolError("this tool needs the context of a run's attempt")
            output = await self.run(args, ctx)
        else:
            output = await self.run(args)
        try:
            json.dumps(output)
        except (TypeError, ValueError) as exc:
            raise ToolError(f"the tool returned something JSON cannot hold: {exc}") from exc
        return output


def tool(
    *, input: type[BaseModel], description: str | None = None
) -> Callable[[ToolFunction], ToolSpec]:
    """Declare a tool: `@runwire.tool(input=Args)` over an async function taking `Args`,
    and optionally a `ToolContext` (`async def send(args: Args, ctx: ToolContext)`) for
    side effects and budgets. Its description (for a model) is `description` or the
    function's docstring."""
    if not (isinstance(input, type) and issubclass(input, BaseModel)):
        raise TypeError(f"input must be a pydantic model class, not {input!r}")

    def declare(fn: ToolFunction) -> ToolSpec:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"{fn!r} is not an async function")
        text = description or inspect.getdoc(fn) or ""
        params = list(inspect.signature(fn).parameters.values())
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if not 1 <= len(positional) <= 2:
            raise TypeError(
                f"{fn!r} must take its arguments, and optionally a ToolContext: "
                f"it takes {len(positional)} positional parameters"
            )
        return ToolSpec(
            run=fn, input_model=input, description=text, takes_context=len(positional) == 2
        )

    return declare


@dataclass
class AttemptContext:
    """Everything an attempt may know and do."""

    run_id: str
    tenant: str
    input: dict[str, Any]
    attempt: int
    resumed: bool
    # The text the run's earlier attempts delivered, which this attempt continues.
    continuation: str
    checkpoint_state: Any
    # Every frame stored for the run when the attempt started (tool calls and results
    # of earlier attempts among them), in seq order.
    history: list[Frame]
    abort: asyncio.Event
    _emit: Callable[[FrameType, dict[str, Any]], Awaitable[None]]
    _checkpoint: Callable[[Any], Awaitable[None]]
    # The tools this executor has (`runwire.tools`), by name.
    tools: Mapping[str, ToolSpec] = field(default_factory=dict)
    _effect: Callable[..., Awaitable[dict[str, Any]]] | None = None
    _reserve: Callable[[str, int, int], Awaitable[None]] | None = None
    _settle: Callable[[str, int, str | None, int], Awaitable[None]] | None = None
    # Begins a wait: (kind, name, payload, timeout_s, key) -> the answer, or raises
    # Waiting / WaitTimeout.
    _wait: (
        Callable[[WaitKind, str | None, Any, float | None, str | None], Awaitable[Any]] | None
    ) = None
    # Sleeps of this many seconds or more are durable timers (None: none is).
    durable_sleep_s: float | None = None
    # Rate limits: (limits, call, tokens) -> None or raises RateLimited; (call, tokens);
    # (limits, what the provider said).
    _take_rate: Callable[[list[str], str, int], Awaitable[bool]] | None = None
    _settle_rate: Callable[[str, int], Awaitable[None]] | None = None
    _observe_rate: Callable[[list[str], dict[str, float]], Awaitable[None]] | None = None

    async def interrupt(
        self, payload: Any = None, *, timeout: float | None = None, key: str | None = None
    ) -> Any:
        """Ask a question (`payload`, any JSON: a `wait` frame carries it to the client)
        and return its answer, the `value` of a `resume` command.

        The run does not hold a worker while it waits: this attempt ends here (the call
        raises `Waiting`, which the runner should let through), and once the answer comes
        the runner runs again in a new attempt, from its last `checkpoint`, and the same
        call returns the answer at once. So checkpoint what was done before asking. Each
        wait is named within the run by `key`, or by its place among the attempt's waits
        (the first wait of an attempt is the same wait in the next). `timeout` (seconds):
        without an answer by then, the call raises `WaitTimeout` (uncaught, the run fails
        with WAIT_TIMEOUT)."""
        if self._wait is None:
            raise RunnerError("waits are not available to this attempt", retryable=False)
        return await self._wait(WaitKind.INTERRUPT, None, payload, timeout, key)

    async def wait_for_signal(
        self, name: str, *, timeout: float | None = None, key: str | None = None
    ) -> Any:
        """Wait for the signal `name` (a `signal` command to this run, from anyone allowed
        to send the tenant's commands) and return its payload. A signal sent before the
        run waits is kept and taken here, in the order they were sent. Waits as
        `interrupt` does (no worker held, `timeout`, `key`)."""
        if self._wait is None:
            raise RunnerError("waits are not available to this attempt", retryable=False)
        return await self._wait(WaitKind.SIGNAL, name, None, timeout, key)

    async def emit(self, type: FrameType, data: dict[str, Any]) -> None:
        """Publish a frame of this attempt."""
        await self._emit(type, data)

    async def message(self, text: str) -> None:
        """Publish a text delta."""
        await self._emit(FrameType.MESSAGE, {"text": text})

    async def checkpoint(self, state: Any) -> None:
        """Save progress that a resumed attempt receives as `checkpoint_state`."""
        await self._checkpoint(state)

    async def effect(
        self,
        kind: str,
        key: str,
        request: dict[str, Any],
        *,
        tokens: int = 0,
        cost: int = 0,
    ) -> dict[str, Any]:
        """Perform an external action once, whatever crashes, and return its receipt.

        `kind` names an effect adapter (`http`, `noop`, or one registered in the group
        `runwire.effects`); `key` is this run's stable name for the action, so a retried
        or resumed attempt asking again gets the stored receipt instead of a second
        action. `effect` frames show each step. A costly action names what it costs
        (`tokens`, `cost` units): reserved from the tenant's and the run's budgets before
        anything leaves the process (BUDGET_EXCEEDED when it does not fit), charged once
        the action happened, given back when it did not. A refused action raises
        RunnerError (EFFECT_FAILED, also when the tenant's policy does not allow `kind`:
        a tenant may perform no kind until an operator allows it; AUTHORIZATION_STALE
        when the tenant's policy changed since the run was submitted); one whose outcome
        is not known yet fails the attempt retryably. An `http` receipt is `{status, id}`
        (`response` too with `"keep_response": true` in the request), and the executor
        sends it only to hosts its operator allows (see `runwire.runners.outbound`).
        """
        if self._effect is None:
            raise RunnerError("effects are not available to this attempt", retryable=False)
        return await self._effect(kind, key, request, tokens=tokens, cost=cost)

    async def reserve(self, key: str, tokens: int = 0, *, cost: int = 0) -> None:
        """Reserve `tokens` (and `cost` units) of the tenant's and the run's budgets for a
        costly call that this attempt names `key`, before making it. Raises RunnerError
        (BUDGET_EXCEEDED, not retryable) when it does not fit. Settle it with `settle`
        after the call; a reservation left unsettled (a crash) is charged by recovery at
        what it reserved (the call may have happened)."""
        if self._reserve is None:
            raise RunnerError("budgets are not available to this attempt", retryable=False)
        await self._reserve(key, tokens, cost)

    async def settle(
        self, key: str, tokens: int = 0, receipt: str | None = None, *, cost: int = 0
    ) -> None:
        """Settle reservation `key` with the tokens (and `cost` units) the call used,
        once: settling again changes nothing. `receipt`: the provider's id for the call."""
        if self._settle is None:
            raise RunnerError("budgets are not available to this attempt", retryable=False)
        await self._settle(key, tokens, receipt, cost)

    async def take_rate(self, limits: Sequence[str], call: str, tokens: int = 0) -> bool:
        """Take room for a call to a model provider (one request, `tokens` tokens) under
        each of the rate limits `limits` an operator set (`runwire limit set`; e.g.
        `openai` and `openai:gpt-4o`; a limit not set takes nothing), before making it.
        `call` names the call within the run: the same name for the same call in a later
        attempt. Without room now, the run waits for it holding no worker: the call raises
        `RateLimited` (let it through) and the runner runs again once room came, where the
        same call gets it at once. The calls waiting under a limit get their room first
        come, first served. RunnerError (not retryable) when the call needs more tokens
        than a limit allows in a minute. Settle it with `settle_rate`. Returns whether
        any of `limits` is set."""
        if self._take_rate is None:
            return False
        return await self._take_rate(list(limits), call, max(0, tokens))

    async def settle_rate(self, call: str, tokens: int) -> None:
        """Settle call `call` with the tokens it used (the provider's usage): what it
        took beyond that is room again, for the calls waiting."""
        if self._settle_rate is not None:
            await self._settle_rate(call, max(0, tokens))

    async def observe_rate(self, limits: Sequence[str], **said: float) -> None:
        """What the provider said of its limits, for every executor's next calls:
        `retry_after_s` (a 429: no call before then), `tokens_left` and
        `tokens_reset_s`, `requests_left` and `requests_reset_s` (its rate-limit
        headers: a call that needs more than is left waits for the reset)."""
        if self._observe_rate is not None and said:
            await self._observe_rate(list(limits), said)

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        call_id: str | None = None,
        announced: bool = False,
    ) -> "ToolOutcome":
        """Call a registered tool: a `tool_call` frame, the call, a `tool_result` frame.
        An unknown tool, bad arguments or the tool's own failure come back as the
        outcome's `error` (also in the frame), for the runner or the model to handle.
        `call_id` names the call (a model's id for it): give the same one when a resumed
        attempt makes the call again, so the tool's effects happen once. A RunnerError
        the tool raises (a budget exceeded, an effect refused or not known yet) is not a
        result: it fails the attempt, as it would the runner's own call. `announced`: the
        call's `tool_call` frame was emitted already (before asking a person about it)."""

        call_id = call_id or f"call_{uuid.uuid4().hex[:12]}"
        if not announced:
            call = {"id": call_id, "name": name, "arguments": arguments}
            await self._emit(FrameType.TOOL_CALL, call)
        spec = self.tools.get(name)
        output: Any = None
        error: str | None = None
        if spec is None:
            error = f"no tool named {name!r} is registered"
        else:
            try:
                output = await spec.call(
                    arguments, ToolContext(self.run_id, self.tenant, call_id, self)
                )
            except ToolError as exc:
                error = str(exc)
            except (RunnerError, AttemptClosed):
                raise  # the attempt's failure (or end), not the call's result
            except Exception as exc:
                log.error("tool %r raised %s", name, type(exc).__name__, exc_info=exc)
                error = unexpected(f"tool {name!r}", exc)
        result = {"id": call_id, "name": name, "output": output, "error": error}
        await self._emit(FrameType.TOOL_RESULT, result)
        return ToolOutcome(call_id, name, output, error)

    async def sleep(self, seconds: float, *, key: str | None = None) -> None:
        """Sleep, waking early if the attempt is aborted. A sleep of `durable_sleep_s` or
        more is a durable timer: the attempt ends, the run waits holding no worker, and
        the runner runs again from its checkpoint once the time has come, where the same
        sleep returns at once (a wait, as `interrupt`'s; `key` names it)."""
        if self.durable_sleep_s is not None and seconds >= self.durable_sleep_s and self._wait:
            await self._wait(WaitKind.SLEEP, None, None, seconds, key)
            return
        if isinstance(self.abort, AbortSignal):
            await self.abort.sleep(seconds)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.abort.wait(), timeout=seconds)


Runner = Callable[[AttemptContext], Coroutine[Any, Any, dict[str, Any] | None]]


@dataclass(frozen=True)
class RunnerSpec:
    """A runner with what the services know about it (see `runner`)."""

    run: Runner
    # The model a run's `input` must fit; the submitter refuses a run whose input does
    # not (`INVALID_REQUEST`). None: any JSON object.
    input_model: type[BaseModel] | None = None
    # Attempts of this runner in flight at once, over all executors (a model provider's
    # concurrency limit); None: the executor's `max_in_flight`.
    max_in_flight: int | None = None
    # The fingerprint of the configuration a run must keep (for a model: model, base
    # URL, sampling settings), from its input and this process's settings. Pinned when
    # the run is submitted (or by its first attempt); an attempt whose fingerprint
    # differs fails with MODEL_CHANGED. None: nothing is pinned.
    pin: Callable[[dict[str, Any]], str] | None = None

    async def __call__(self, ctx: AttemptContext) -> dict[str, Any] | None:
        return await self.run(ctx)

    @classmethod
    def of(cls, obj: object, *, where: str) -> "RunnerSpec":
        """`obj` as a declaration: a `RunnerSpec`, or an async function taking an
        `AttemptContext`. Anything else is refused with `where` in the message."""
        if isinstance(obj, RunnerSpec):
            return obj
        if inspect.iscoroutinefunction(obj):
            return cls(run=obj)
        raise TypeError(
            f"{where} is {type(obj).__name__}, not a runner: expected an async function "
            "taking an AttemptContext, or one declared with runwire.runner(...)"
        )


def runner(
    *,
    input: type[BaseModel] | None = None,
    max_in_flight: int | None = None,
    pin: Callable[[dict[str, Any]], str] | None = None,
) -> Callable[[Runner], RunnerSpec]:
    """Declare a runner: `@runwire.runner(input=MyInput, max_in_flight=8)` over an async
    function taking an `AttemptContext`. Register it under a name with the entry-point
    group `runwire.runners` or the `RUNWIRE_RUNNERS` setting."""
    if input is not None and not (isinstance(input, type) and issubclass(input, BaseModel)):
        raise TypeError(f"input must be a pydantic model class, not {input!r}")
    if max_in_flight is not None and max_in_flight < 1:
        raise ValueError(f"max_in_flight must be at least 1, not {max_in_flight}")

    def declare(fn: Runner) -> RunnerSpec:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"{fn!r} is not an async function")
        return RunnerSpec(run=fn, input_model=input, max_in_flight=max_in_flight, pin=pin)

    return declare
