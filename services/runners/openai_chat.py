"""The `openai` runner: streaming chat completions from any OpenAI-compatible endpoint,
through the official `openai` SDK.

A run's input is the familiar request body (`model`, `messages`, `tools`, `tool_choice`,
`temperature`, `max_tokens`, ...) plus `max_steps`, the number of model calls the tool
loop may make. Each model call streams `message` frames (text deltas), a `tool_call`
frame per completed call and a `usage` frame. Calls of tools registered with runwire
(`runwire.tools`) are executed (`tool_result` frames) and the loop goes on; a call of any
other tool ends the run, with the calls in its result for the client to answer.

Failures map to outcomes: 408, 409, 429, 5xx, connection errors, timeouts and a stream
cut short are retryable (runwire's retries, visible as attempts; the next waits at least
the provider's `Retry-After`); 400, 401, 403, 404 and 422 fail the run (`RUNNER_FATAL`,
with the provider's message). The SDK retries nothing itself. A cancel or a deadline
closes the HTTP stream at once.

Each model call takes room under the rate limits an operator set for the provider key
(`RUNWIRE_OPENAI_RATE_LIMIT_KEY`, `openai` by default) and for `<key>:<model>` (see
`runwire limit set`): the tokens it may take, settled with the usage it reports. A call
without room waits, its run queued without a slot. A 429 under a limit makes every
call under it wait as the provider asks, and the run waits instead of failing; the
provider's rate-limit headers (tokens and requests left) hold back calls that would not
fit before their reset.

The base URL and the key come from `RUNWIRE_OPENAI_BASE_URL` and `RUNWIRE_OPENAI_API_KEY`
(else the SDK's `OPENAI_BASE_URL` and `OPENAI_API_KEY`). The key is never written to a
log, a frame, an error or a span: a provider message that quotes it is redacted. The
model, the base URL and the sampling settings are pinned when the run is submitted; an
attempt that would run with others fails with `MODEL_CHANGED`.
"""

import asyncio
import contextlib
import hashlib
import json
import logging
import re
from collections.abc import Awaitable
from dataclasses import dataclass, field
from functools import cache
from importlib import import_module
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

from pydantic import Field

from runwire.contracts.base import WireModel
from runwire.contracts.frames import FrameType
from runwire.runners.base import AttemptContext, RunnerError, RunnerSpec
from runwire.runners.openai_headers import rate_headers, retry_after
from runwire.runners.openai_history import assistant_message, resume_conversation
from runwire.runners.openai_settings import DEFAULT_BASE_URL, OpenAISettings

if TYPE_CHECKING:
    from openai import AsyncOpenAI

log = logging.getLogger(__name__)

DEFAULT_MAX_STEPS = 8
# What a model call is reserved for when the run sets no limit on the answer's length.
DEFAULT_ANSWER_TOKENS = 4096
RETRYABLE_STATUS = frozenset({408, 409, 429})
FATAL_STATUS = frozenset({400, 401, 403, 404, 422})
# The settings that change what a model answers: pinned with the model and base URL.
SAMPLING = (
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "reasoning_effort",
    "response_format",
)
# How long every call under a limit waits after a 429 that names no Retry-After.
RATE_LIMITED_WAIT_S = 1.0
RESUME_INSTRUCTION = (
    "Your previous answer was cut off after the text above. Continue it from exactly where "
    "it stops, without repeating any of it."
)

T = TypeVar("T")


# The `openai` SDK takes most of a second to import: every submitter and executor loads
# this runner, and only the attempts that call a model need the SDK, so it is imported
# on first use.
@cache
def _sdk() -> Any:
    return import_module("openai")


@cache
def _http() -> Any:
    """The HTTP library the `openai` SDK streams with (`httpx2`, or `httpx` before it):
    a stream cut short raises its transport errors, not the SDK's."""
    for name in ("httpx2", "httpx"):
        with contextlib.suppress(ImportError):
            return import_module(name)
    raise ImportError("the openai SDK's HTTP library (httpx2 or httpx) is not installed")


class OpenAIInput(WireModel):
    """A run of the `openai` runner: a chat completions request body, streamed."""

    model: str = Field(min_length=1, max_length=200)
    messages: list[dict[str, Any]] = Field(min_length=1)
    # Tools the client handles itself: a call of one ends the run with the call.
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    # Registered tools offered to the model: None, every one; [] none.
    runwire_tools: list[str] | None = None
    # Registered tools whose every call waits for a person's approval: the run waits (an
    # interrupt carrying the call) until `resume` approves it (`true`, or `{"approve":
    # true}`, with `"arguments"` to change them; `"approved"`, the console's, is the same)
    # or rejects it (`{"approve": false, "reason": ...}`: the model reads the reason as the
    # call's error).
    approve_tools: list[str] = Field(default_factory=list)
    max_steps: int = Field(default=DEFAULT_MAX_STEPS, ge=1, le=100)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, int] | None = None
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = None
    response_format: dict[str, Any] | None = None
    user: str | None = None


@dataclass
class _Call:
    """A tool call as its deltas arrive."""

    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass
class _Step:
    """What one model call answered."""

    text: str = ""
    calls: dict[int, _Call] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: dict[str, int] | None = None
    model: str | None = None
    id: str | None = None
    # What the provider's rate-limit headers said (see _rate_headers).
    said: dict[str, float] = field(default_factory=dict)


class _Aborted(Exception):
    """The attempt was aborted (cancel, deadline, shutdown) while the model answered."""


async def _or_abort(ctx: AttemptContext, work: Awaitable[T]) -> T:
    """`work`, unless the attempt is aborted first: then `work` is cancelled at once."""
    task = asyncio.ensure_future(work)
    aborted = asyncio.ensure_future(ctx.abort.wait())
    try:
        await asyncio.wait({task, aborted}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        aborted.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise _Aborted
    return task.result()


class OpenAIChat:
    """The runner, for one configuration (settings read once, a client per process)."""

    def __init__(self, settings: OpenAISettings) -> None:
        self.settings = settings
        self._client: tuple[asyncio.AbstractEventLoop, AsyncOpenAI] | None = None

    @property
    def client(self) -> "AsyncOpenAI":
        """One client (one connection pool) per event loop that runs attempts."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._client[0] is not loop:
            self._client = (loop, self._make_client())
        return self._client[1]

    def _make_client(self) -> "AsyncOpenAI":
        s, openai = self.settings, _sdk()
        client: AsyncOpenAI = openai.AsyncOpenAI(
            base_url=s.base_url,
            # The SDK refuses to start without a key; a local server may need none.
            api_key=s.api_key.get_secret_value() if s.api_key else "not-set",
            max_retries=0,  # retries are runwire's: attempts, visible as such
            timeout=openai.Timeout(s.read_timeout_s, connect=s.connect_timeout_s),
        )
        return client

    def pin(self, value: dict[str, Any]) -> str:
        """The fingerprint of the model, the base URL and the sampling settings."""
        args = OpenAIInput.model_validate(value)
        pinned = {
            "model": args.model,
            "base_url": self.settings.base_url.rstrip("/"),
            **{name: getattr(args, name) for name in SAMPLING},
        }
        return hashlib.sha256(json.dumps(pinned, sort_keys=True).encode()).hexdigest()

    def _redact(self, text: str) -> str:
        key = self.settings.api_key.get_secret_value() if self.settings.api_key else ""
        if len(key) >= 8:
            text = text.replace(key, "[redacted]")
            # Providers quote a key masked in its middle: its ends still say too much.
            text = re.sub(re.escape(key[:6]) + r"\S*" + re.escape(key[-4:]), "[redacted]", text)
        return text

    def _failed_use(
        self, exc: Exception, step: _Step, estimate: int, estimate_cost: int
    ) -> tuple[int, int]:
        """What a failed model call is charged (tokens, cost units): the usage the provider
        reported; nothing when it refused the call (an error status); else what was
        reserved, since the call may have run (a connection lost, a stream cut)."""
        if step.usage is not None:
            used = step.usage
            return used["total_tokens"], self.settings.cost(
                used["input_tokens"], used["output_tokens"]
            )
        if isinstance(exc, _sdk().APIStatusError):
            return 0, 0
        return estimate, estimate_cost

    def _failure(self, exc: Exception) -> RunnerError:
        """The outcome of a failed model call."""
        openai, http = _sdk(), _http()
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            message = self._redact(f"model provider answered {status}: {exc.message}")
            if status in FATAL_STATUS:
                return RunnerError(message, retryable=False)
            if status in RETRYABLE_STATUS or status >= 500:
                return RunnerError(
                    message, retryable=True, retry_after_s=retry_after(exc.response.headers)
                )
            return RunnerError(message, retryable=False)
        if isinstance(exc, openai.APITimeoutError | http.TimeoutException):
            return RunnerError("the model provider did not answer in time", retryable=True)
        if isinstance(exc, openai.APIConnectionError | http.TransportError):
            # What the HTTP client says (an address, a proxy's URL with its credentials)
            # is for the log; a client reads the failure's class.
            cause = exc.__cause__ or exc
            log.warning("connection to the model provider failed: %s", self._redact(str(cause)))
            return RunnerError(
                f"connection to the model provider failed ({type(cause).__name__}); the "
                "executor logged the details with the run_id",
                retryable=True,
            )
        if isinstance(exc, openai.APIError):
            return RunnerError(self._redact(f"model provider error: {exc.message}"), retryable=True)
        raise exc

    def _tools(self, ctx: AttemptContext, args: OpenAIInput) -> list[dict[str, Any]]:
        names = list(ctx.tools) if args.runwire_tools is None else args.runwire_tools
        unknown = [n for n in names if n not in ctx.tools]
        if unknown:
            raise RunnerError(f"no tool registered as {', '.join(unknown)}", retryable=False)
        offered = [
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": ctx.tools[name].description,
                    "parameters": ctx.tools[name].schema(),
                },
            }
            for name in names
        ]
        return [*offered, *(args.tools or [])]

    def _request(
        self, args: OpenAIInput, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]:
        body = args.model_dump(
            exclude_none=True,
            exclude={"messages", "tools", "runwire_tools", "approve_tools", "max_steps"},
        )
        body.update(messages=messages, stream=True, stream_options={"include_usage": True})
        if tools:
            body["tools"] = tools
        else:
            body.pop("tool_choice", None)
            body.pop("parallel_tool_calls", None)
        return body

    async def _step(self, ctx: AttemptContext, request: dict[str, Any], step: _Step) -> None:
        """One streamed model call into `step`; text deltas are emitted as they arrive."""
        raw = await _or_abort(ctx, self.client.chat.completions.with_raw_response.create(**request))
        step.said = rate_headers(raw.headers)
        stream = raw.parse()
        try:
            await _or_abort(ctx, self._consume(ctx, stream, step))
        finally:
            with contextlib.suppress(Exception):
                await stream.close()

    async def _consume(self, ctx: AttemptContext, stream: Any, step: _Step) -> None:
        async for chunk in stream:
            step.model = chunk.model or step.model
            step.id = chunk.id or step.id
            if chunk.usage is not None:
                step.usage = {
                    "input_tokens": chunk.usage.prompt_tokens or 0,
                    "output_tokens": chunk.usage.completion_tokens or 0,
                    "total_tokens": chunk.usage.total_tokens or 0,
                }
            for choice in chunk.choices[:1]:
                delta = choice.delta
                if delta.content:
                    step.text += delta.content
                    await ctx.message(delta.content)
                for part in delta.tool_calls or []:
                    call = step.calls.setdefault(part.index, _Call())
                    call.id = part.id or call.id
                    if part.function is not None:
                        call.name += part.function.name or ""
                        call.arguments += part.function.arguments or ""
                if choice.finish_reason:
                    step.finish_reason = choice.finish_reason

    async def _run_tools(
        self,
        ctx: AttemptContext,
        calls: list[dict[str, Any]],
        messages: list[dict[str, Any]],
        *,
        approve: list[str],
        announced: bool,
    ) -> list[dict[str, Any]]:
        """Run the calls of registered tools (their results join `messages`), each of
        `approve` once a person approved it; return the calls of tools the client
        handles. `announced`: their `tool_call` frames are stored (a resumed attempt)."""
        client_calls = []
        for call in calls:
            if call["name"] not in ctx.tools:
                client_calls.append(call)
                continue
            if call["name"] not in approve:
                outcome = await ctx.call_tool(call["name"], call["arguments"], call_id=call["id"])
                error, output = outcome.error, outcome.output
            else:
                if not announced:
                    await ctx.emit(FrameType.TOOL_CALL, call)
                error, output = await _approved_call(ctx, call)
            content = json.dumps({"error": error} if error is not None else output)
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": content})
        return client_calls

    async def _model_call(
        self,
        ctx: AttemptContext,
        args: OpenAIInput,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        steps: int,
    ) -> _Step:
        """One model call: room under the rate limits and the budgets taken before it
        (the prompt's size and the most it may answer), settled with its usage after."""
        prompt, answer = _estimate(args, messages)
        estimate, estimate_cost = prompt + answer, self.settings.cost(prompt, answer)
        # Named by its place in the conversation: the same call in a later attempt.
        call = f"model-call-at-{len(messages)}"
        limits = [self.settings.rate_limit_key, f"{self.settings.rate_limit_key}:{args.model}"]
        limited = await ctx.take_rate(limits, call, estimate)
        reservation = f"model-call-{steps}"
        try:
            await ctx.reserve(reservation, estimate, cost=estimate_cost)
        except RunnerError:
            await ctx.settle_rate(call, 0)  # no call made
            raise
        step = _Step()
        try:
            await self._step(ctx, self._request(args, messages, tools), step)
        except _Aborted:
            # Cut short: count what it may have used.
            await ctx.settle(reservation, estimate, cost=estimate_cost)
            await ctx.settle_rate(call, estimate)
            raise
        except Exception as exc:  # noqa: BLE001 - mapped to an outcome, or raised again
            used, cost = self._failed_use(exc, step, estimate, estimate_cost)
            await ctx.settle(reservation, used, step.id, cost=cost)
            failure = self._failure(exc)
            if limited and _rate_limited(exc):
                # The provider's limit is tighter than runwire's: every call under it
                # waits as long as it asks (told before this call's room is given back,
                # so that no waiting call goes now), and this run waits in the queue (the
                # attempt not counted) rather than failing.
                wait = failure.retry_after_s or RATE_LIMITED_WAIT_S
                said = rate_headers(cast(Any, exc).response.headers)
                await ctx.observe_rate(limits, **said, retry_after_s=wait)
                await ctx.settle_rate(call, used)
                await ctx.take_rate(limits, call, estimate)
            await ctx.settle_rate(call, used)
            raise failure from None
        if step.usage is not None:
            used = step.usage["total_tokens"]
            cost = self.settings.cost(step.usage["input_tokens"], step.usage["output_tokens"])
        else:
            used, cost = estimate, estimate_cost
        await ctx.settle(reservation, used, step.id, cost=cost)
        await ctx.settle_rate(call, used)
        if limited and step.said:
            await ctx.observe_rate(limits, **step.said)
        return step

    async def __call__(self, ctx: AttemptContext) -> dict[str, Any]:
        # The first attempt imports the SDK in a thread: the event loop goes on renewing
        # the leases of every attempt meanwhile (an import of a second would stall them).
        await asyncio.to_thread(_sdk)
        if self.settings.api_key is None and self.settings.base_url == DEFAULT_BASE_URL:
            raise RunnerError(
                "no API key for the OpenAI API: set RUNWIRE_OPENAI_API_KEY (or OPENAI_API_KEY) "
                "where the executors run",
                retryable=False,
            )
        args = OpenAIInput.model_validate(ctx.input)
        tools = self._tools(ctx, args)
        messages = list(args.messages)
        resumed = resume_conversation(ctx.history)
        messages += resumed.messages
        usage = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
        steps = 0
        if resumed.unanswered:
            # Calls an earlier attempt made whose results were not stored: run them now,
            # under the same call ids (a tool may so run twice for one call; what must
            # happen once it does through ctx.effect, which the call id keeps the same).
            client_calls = await self._run_tools(
                ctx, resumed.unanswered, messages, approve=args.approve_tools, announced=True
            )
            if client_calls:
                return _client_calls(client_calls, messages, usage, steps)
        if resumed.partial:
            messages += [
                {"role": "assistant", "content": resumed.partial},
                {"role": "system", "content": RESUME_INSTRUCTION},
            ]
        while steps < args.max_steps:
            steps += 1
            try:
                step = await self._model_call(ctx, args, messages, tools, steps)
            except _Aborted:
                return {"usage": usage}  # the executor records the abort, not this result
            if step.usage is not None:
                for key in usage:
                    usage[key] += step.usage[key]
                await ctx.emit(FrameType.USAGE, {**step.usage, "model": step.model})
            if step.finish_reason is None:
                raise RunnerError("the model's stream ended before its answer did", retryable=True)
            if not step.calls:
                return {"finish_reason": step.finish_reason, "usage": usage, "steps": steps}
            calls = [_parsed(step.calls[i]) for i in sorted(step.calls)]
            messages.append(assistant_message(step.text, calls))
            for call in calls:
                if call["name"] not in ctx.tools:
                    await ctx.emit(FrameType.TOOL_CALL, call)
            client_calls = await self._run_tools(
                ctx, calls, messages, approve=args.approve_tools, announced=False
            )
            if client_calls:
                return _client_calls(client_calls, messages, usage, steps)
        raise RunnerError(
            f"the model still called tools after {args.max_steps} steps (max_steps)",
            retryable=False,
        )


async def _approved_call(ctx: AttemptContext, call: dict[str, Any]) -> tuple[str | None, Any]:
    """A call of a tool that needs approval: asked (the run waits until answered), then
    made with the arguments approved, or not made; (error, output)."""
    answer = await ctx.interrupt({"tool_call": call}, key=f"approve-{call['id']}")
    # `approved` is what the web console's Approve and Reject send.
    said = answer.get("approve", answer.get("approved")) if isinstance(answer, dict) else answer
    approved = said is True
    if not approved:
        reason = answer.get("reason") if isinstance(answer, dict) else None
        error = f"a person rejected the call{f': {reason}' if reason else ''}"
        result = {"id": call["id"], "name": call["name"], "output": None, "error": error}
        await ctx.emit(FrameType.TOOL_RESULT, result)
        return error, None
    arguments = answer.get("arguments") if isinstance(answer, dict) else None
    outcome = await ctx.call_tool(
        call["name"],
        arguments if isinstance(arguments, dict) else call["arguments"],
        call_id=call["id"],
        announced=True,
    )
    return outcome.error, outcome.output


def _rate_limited(exc: Exception) -> bool:
    """A 429 that passes: too many requests or tokens for now (not a quota spent, which
    waiting does not cure: that one fails the attempt, as without a limit)."""
    return (
        isinstance(exc, _sdk().RateLimitError)
        and getattr(exc, "code", None) != "insufficient_quota"
    )


def _estimate(args: OpenAIInput, messages: list[dict[str, Any]]) -> tuple[int, int]:
    """Tokens a model call may take, (prompt, answer): about one per three characters of
    its messages, and the most it may answer (`max_completion_tokens`, `max_tokens`,
    else a default)."""
    answer = args.max_completion_tokens or args.max_tokens or DEFAULT_ANSWER_TOKENS
    return len(json.dumps(messages)) // 3, answer


def _parsed(call: _Call) -> dict[str, Any]:
    """A streamed call as a `tool_call` frame's data (arguments as an object)."""
    try:
        arguments = json.loads(call.arguments or "{}")
    except json.JSONDecodeError:
        arguments = {"_unparsed": call.arguments}
    if not isinstance(arguments, dict):
        arguments = {"_value": arguments}
    return {"id": call.id, "name": call.name, "arguments": arguments}


def _client_calls(
    calls: list[dict[str, Any]], messages: list[dict[str, Any]], usage: dict[str, int], steps: int
) -> dict[str, Any]:
    """The result of a run that ends on calls of tools the client handles: the calls, and
    the conversation to send back with their results."""
    return {
        "finish_reason": "tool_calls",
        "tool_calls": calls,
        "messages": messages,
        "usage": usage,
        "steps": steps,
    }


def make_runner(settings: OpenAISettings | None = None) -> RunnerSpec:
    """The `openai` runner for `settings` (by default read from the environment)."""
    settings = settings or OpenAISettings()
    chat = OpenAIChat(settings)
    return RunnerSpec(
        run=chat, input_model=OpenAIInput, max_in_flight=settings.max_in_flight, pin=chat.pin
    )


# Registered as `openai` (entry-point group `runwire.runners`).
openai_runner = make_runner()
