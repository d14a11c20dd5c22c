"""Commands: request/reply FastStream subscribers that answer every request.

A command is served on `<prefix>.{tenant}.cmd.<name>` by a FastStream subscriber in the
service's queue group; its handler declares the contract model of its body, reads the
tenant of the command with `tenant()` (the subject's `{tenant}` token, never the body)
and returns the reply model. Whatever arrives, the requester gets that reply or
`{ok: false, error: {code, message, retryable}}`, and the service keeps serving.

Three pieces do it, outermost first, around each request:

- FastStream's telemetry middleware continues the caller's trace from the request's
  `traceparent` header (or starts one). Its span is this command's span: renamed
  `command <name>`, with the tenant. A reply's own span is named `reply`, not after the
  requester's inbox (a subject per request). While the process records no spans (no
  exporter), the caller's context is only carried into the handler, which is all a run
  needs to join the caller's trace: the middleware's spans, built and dropped for
  nothing, cost about 85 µs per command.
- `CommandReplies`, a FastStream middleware of ours, turns what happened into the reply:
  the handler's result, a `RunwireError`'s code, UNAVAILABLE (retryable, logged with
  its context) for anything unexpected, PAYLOAD_TOO_LARGE for a reply over the server's
  message limit; it measures `runwire_command_duration_seconds`. FastStream alone would
  log a failed handler and send no reply at all.
- `json_body`, the subscriber's decoder: size limit first, then JSON, an object, the
  contract model, each failing as a wire error (INVALID_REQUEST, PAYLOAD_TOO_LARGE).
  FastStream decodes a body when it calls the handler, inside the middlewares, so a bad
  body reaches `CommandReplies` like a handler's own error.

Commands run concurrently: each subscriber has `COMMAND_WORKERS` workers (FastStream's
`max_workers`; a core subscriber without it handles one message at a time).
"""

import asyncio
import json
import logging
import math
import time
import typing
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any, TypeVar

import nats.errors
from faststream._internal.context.repository import ContextRepo
from faststream._internal.middlewares import BaseMiddleware
from faststream.message import StreamMessage
from faststream.nats import NatsResponse, NatsRouter
from faststream.nats.opentelemetry.provider import NatsTelemetrySettingsProvider
from faststream.nats.subscriber.usecases import ConcurrentCoreSubscriber
from faststream.opentelemetry.middleware import TelemetryMiddleware
from faststream.response import PublishCommand, PublishType
from nats.aio.msg import Msg
from opentelemetry import context as otel_context
from opentelemetry import trace
from pydantic import BaseModel, ValidationError

from runwire.contracts.errors import ErrorBody, ErrorCode, ErrorReply
from runwire.contracts.subjects import is_inbox, reply_inboxes, valid_tenant
from runwire.runtime import tracing
from runwire.runtime.app import Service
from runwire.runtime.errors import InvalidRequest, NotFound, PayloadTooLarge, RunwireError
from runwire.runtime.logs import fields
from runwire.runtime.metrics import COMMAND_DURATION, COMMANDS_REFUSED
from runwire.runtime.storable import UNSTORABLE_TEXT

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)
H = TypeVar("H", bound=Callable[..., Awaitable[BaseModel]])

# The tenant of the command being answered: the subject's `{tenant}` token. Set by
# `CommandReplies` around the handler. (FastStream's `Path("tenant")` parameter would do
# the same, but fast_depends resolves it in a worker thread: a thread hop per command,
# which halved the submitter's throughput.)
_TENANT: ContextVar[str] = ContextVar("command_tenant")


def tenant() -> str:
    """The tenant of the command this handler answers."""
    return _TENANT.get()


# Room for the envelope around an input of the maximum size.
ENVELOPE_BYTES = 16 * 1024
# What a client is told when the store or the broker failed (the service logs what).
UNAVAILABLE_MESSAGE = (
    "runwire could not complete the command now (the service logged why); try again"
)
# How deep a body's objects and arrays may nest, and how long a number may be written.
MAX_DEPTH = 64
MAX_NUMBER_CHARS = 100
# Commands one subscriber handles at once; more wait in the connection's buffer.
COMMAND_WORKERS = 256
# How long a stopping service waits for the commands it has taken to be answered.
DRAIN_S = 10.0
DRAIN_POLL_S = 0.01


def describe(exc: ValidationError) -> str:
    """A short, readable account of what is wrong with a body."""
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "body"
        parts.append(f"{where}: {err['msg']}")
    more = len(exc.errors()) - 5
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def _number(text: str) -> str:
    if len(text) > MAX_NUMBER_CHARS:
        raise InvalidRequest(
            f"a number of {len(text)} characters is over the limit of {MAX_NUMBER_CHARS}"
        )
    return text


def _int(text: str) -> int:
    return int(_number(text))


def _float(text: str) -> float:
    value = float(_number(text))
    if not math.isfinite(value):
        raise InvalidRequest(f"the number {text} is out of range")
    return value


def _constant(name: str) -> Any:
    raise InvalidRequest(f"{name} is not JSON")


def _unstorable(obj: Any) -> str | None:
    """Where `obj` holds what no store can keep: nesting past MAX_DEPTH, or text with a
    NUL character or a lone surrogate (a path such as `input.messages.0`); None if
    nothing. Only walked for a body that may hold one (see `parse`)."""
    stack: list[tuple[Any, int, tuple[str, ...]]] = [(obj, 1, ())]
    while stack:
        value, level, where = stack.pop()
        problem = None
        if isinstance(value, str):
            if UNSTORABLE_TEXT.search(value):
                problem = "text with a NUL character or a lone surrogate cannot be stored"
        elif isinstance(value, dict | list):
            if level > MAX_DEPTH:
                problem = f"nested more than {MAX_DEPTH} levels deep"
            else:
                items = value.items() if isinstance(value, dict) else enumerate(value)
                for key, item in items:
                    if isinstance(key, str) and UNSTORABLE_TEXT.search(key):
                        problem = "a key with a NUL character or a lone surrogate cannot be stored"
                        break
                    stack.append((item, level + 1, (*where, str(key))))
        if problem is not None:
            path = ".".join(where[:8]) + (".…" if len(where) > 8 else "")
            return f"{path or 'body'}: {problem}"
    return None


def parse(model: type[M], data: bytes, *, max_bytes: int) -> M:
    """Decode and validate a command body, raising a wire error for bad input: over the
    size limit, not JSON, not an object, numbers too long or out of range, nesting too
    deep, text Postgres cannot store (NUL, lone surrogates), or not the contract model."""
    if len(data) > max_bytes + ENVELOPE_BYTES:
        raise PayloadTooLarge(f"body of {len(data)} bytes is over the limit of {max_bytes}")
    try:
        obj = json.loads(data, parse_int=_int, parse_float=_float, parse_constant=_constant)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidRequest(f"body is not JSON: {exc}") from exc
    except RecursionError:
        raise InvalidRequest(f"body is nested more than {MAX_DEPTH} levels deep") from None
    if not isinstance(obj, dict):
        raise InvalidRequest("body must be a JSON object")
    # Only an escape can put a NUL or a lone surrogate in a string (raw ones are not
    # JSON, or not UTF-8), and only that many brackets can nest that deep: most bodies
    # need no walk.
    if b"\\u" in data or data.count(b"{") + data.count(b"[") > MAX_DEPTH:
        problem = _unstorable(obj)
        if problem is not None:
            raise InvalidRequest(problem)
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        raise InvalidRequest(describe(exc)) from exc


def json_body(model: type[M], max_bytes: int) -> Callable[[StreamMessage[Any]], Awaitable[M]]:
    """A FastStream decoder: the body as `model`, or a wire error (see `parse`)."""

    async def decode(msg: StreamMessage[Any]) -> M:
        return parse(model, msg.body, max_bytes=max_bytes)

    return decode


class HeadedReply:
    """A reply that carries headers of the wire contract besides its body: a base of
    its model. (A plain class: a runtime-checked Protocol cost 9 µs per reply.)"""

    def reply_headers(self) -> dict[str, str]:
        return {}


def _error(code: ErrorCode, message: str, *, retryable: bool) -> ErrorReply:
    return ErrorReply(error=ErrorBody(code=code, message=message, retryable=retryable))


def _answerable(reply_to: str, tenant: str) -> bool:
    """Whether a command of `tenant` may be answered at `reply_to`: under the tenant's
    own inbox (or NATS's default). A subject whose tenant token is not one is answered
    INVALID_REQUEST in any inbox: that fixed answer says nothing of anyone."""
    if not valid_tenant(tenant):
        return is_inbox(reply_to)
    return reply_to.startswith(reply_inboxes(tenant))


class _Answer(BaseMiddleware[Any, Any]):
    """One command's reply: see `CommandReplies`."""

    def __init__(self, msg: Any, /, *, context: ContextRepo, max_payload: int) -> None:
        super().__init__(msg, context=context)
        self._max_payload = max_payload

    async def consume_scope(
        self, call_next: Callable[[StreamMessage[Any]], Awaitable[Any]], msg: StreamMessage[Any]
    ) -> bytes | NatsResponse:
        started = time.monotonic()
        subject = str(msg.raw_message.subject)
        name = subject.rsplit(".", 1)[-1]
        tenant = str(msg.path.get("tenant", ""))
        if msg.reply_to and not _answerable(msg.reply_to, tenant):
            # The reply subject is the requester's choice: answering there would publish
            # for it (jobs, another tenant's frames or events). Not served, not answered.
            log.warning(
                "command %s refused: its reply subject is outside the tenant's inbox",
                name,
                extra=fields(tenant=tenant, reply_to=msg.reply_to[:200]),
            )
            COMMANDS_REFUSED.labels(name).inc()
            msg.reply_to = ""
            return b""
        # FastStream's span for this message, in the caller's trace when it sent one.
        span = trace.get_current_span()
        span.update_name(f"command {name}")
        span.set_attributes({"tenant": tenant, "messaging.destination.name": subject})
        reply = await self._reply_to(name, tenant, call_next, msg)
        body = reply.model_dump_json().encode()
        if len(body) > self._max_payload:
            reply = _error(
                ErrorCode.PAYLOAD_TOO_LARGE,
                f"the reply of {len(body)} bytes is over the message limit",
                retryable=False,
            )
            body = reply.model_dump_json().encode()
        if isinstance(reply, ErrorReply):
            tracing.failed(span, reply.error.code.value)
        COMMAND_DURATION.labels(name).observe(time.monotonic() - started)
        headers = reply.reply_headers() if isinstance(reply, HeadedReply) else None
        return NatsResponse(body, headers=headers) if headers else body

    async def _reply_to(
        self,
        name: str,
        tenant: str,
        call_next: Callable[[StreamMessage[Any]], Awaitable[Any]],
        msg: StreamMessage[Any],
    ) -> BaseModel:
        try:
            if not valid_tenant(tenant):
                raise InvalidRequest(f"invalid tenant {tenant!r} in subject")
            token = _TENANT.set(tenant)
            try:
                reply = await call_next(msg)
            finally:
                _TENANT.reset(token)
            if not isinstance(reply, BaseModel):
                raise TypeError(f"command {name} answered {type(reply).__name__}, not a model")
            return reply
        except RunwireError as exc:
            if not isinstance(exc, InvalidRequest | PayloadTooLarge | NotFound):
                log.warning("command %s failed: %s", name, exc.message, extra=fields(code=exc.code))
            if exc.code == ErrorCode.UNAVAILABLE:
                # What Postgres or NATS said stays in the log: no driver text, no query,
                # no address reaches a client.
                return _error(ErrorCode.UNAVAILABLE, UNAVAILABLE_MESSAGE, retryable=exc.retryable)
            return ErrorReply(error=exc.body())
        except Exception:
            log.exception("command %s failed unexpectedly", name, extra=fields(tenant=tenant))
            return _error(ErrorCode.UNAVAILABLE, UNAVAILABLE_MESSAGE, retryable=True)


class CommandReplies:
    """FastStream middleware: every command request gets its reply (see the module)."""

    def __init__(self, service: Service[Any]) -> None:
        self._service = service

    def __call__(self, msg: Any, /, *, context: ContextRepo) -> _Answer:
        max_payload = int(self._service.broker.nc.max_payload)
        return _Answer(msg, context=context, max_payload=max_payload)


class _CommandTelemetry(NatsTelemetrySettingsProvider):
    """FastStream's NATS span settings, but a reply's span is named `reply publish`: the
    requester's inbox is a subject of its own per request, one span name each."""

    def get_publish_destination_name(self, cmd: PublishCommand) -> str:
        if cmd.publish_type is PublishType.REPLY:
            return "reply"
        return super().get_publish_destination_name(cmd)


def _command_telemetry(msg: Any) -> _CommandTelemetry | None:
    return _CommandTelemetry() if isinstance(msg, Msg) or msg is None else None


class _CarriedContext(BaseMiddleware[Any, Any]):
    """The caller's trace context from a request's `traceparent`, current while the
    handler runs (what FastStream's telemetry middleware does, without spans)."""

    async def consume_scope(
        self, call_next: Callable[[StreamMessage[Any]], Awaitable[Any]], msg: StreamMessage[Any]
    ) -> Any:
        parent = tracing.context_from_headers(msg.headers)
        if parent is None:
            return await call_next(msg)
        token = otel_context.attach(parent)
        try:
            return await call_next(msg)
        finally:
            otel_context.detach(token)


class CommandTrace:
    """FastStream middleware: the command's span when this process records spans (see
    the module), the caller's context alone when it does not. Decided per message: the
    services' applications are built before their process sets up tracing."""

    def __init__(self) -> None:
        self._telemetry = TelemetryMiddleware(settings_provider_factory=_command_telemetry)

    def __call__(self, msg: Any, /, *, context: ContextRepo) -> BaseMiddleware[Any, Any]:
        if tracing.recording():
            return self._telemetry(msg, context=context)
        return _CarriedContext(msg, context=context)


class Commands:
    """A service's commands: one FastStream subscriber each, in the service's queue group."""

    def __init__(self, service: Service[Any], queue: str) -> None:
        self._service = service
        self._queue = queue
        self._router = NatsRouter(middlewares=[CommandTrace(), CommandReplies(service)])
        service.faststream.include_router(self._router)
        self.subscribers: list[ConcurrentCoreSubscriber] = []
        service.stopping.append(self.stop)

    def __call__(self, name: str, *, max_bytes: int) -> Callable[[H], H]:
        """Serve `<prefix>.{tenant}.cmd.<name>` with the decorated handler, whose `body`
        parameter's model is the body's and whose return model is the reply's."""

        def register(handler: H) -> H:
            hints = typing.get_type_hints(handler)
            title = f"cmd.{name}"
            subscriber = self._router.subscriber(
                self._service.subjects.command("{tenant}", name),
                queue=self._queue,
                max_workers=COMMAND_WORKERS,
                decoder=json_body(hints["body"], max_bytes),
                title=title,
            )
            subscriber(handler)
            assert isinstance(subscriber, ConcurrentCoreSubscriber)
            self.subscribers.append(subscriber)
            self._service.faststream.replies[title] = (hints["return"], ErrorReply)
            return handler

        return register

    async def stop(self) -> None:
        """Stop taking commands and answer those already taken.

        FastStream's own stop ignores whatever arrives once it begins (no reply at all,
        the requester waits for its timeout). So first the subscriptions are drained:
        the server sends no more (another replica answers, or the requester hears at
        once that nobody does) and every message already delivered is handed to a
        worker; then, once the workers are idle, FastStream stops the subscribers."""
        for subscriber in self.subscribers:
            subscription = subscriber.subscription
            if subscription is None:
                continue
            try:
                await subscription.drain()  # type: ignore[no-untyped-call]  # nats-py's
                subscriber.subscription = None  # drained: nothing left to unsubscribe
            except nats.errors.Error as exc:
                log.warning("commands not drained (%s); stopping them as they are", exc)
        deadline = time.monotonic() + DRAIN_S
        # FastStream does not signal when its workers are done: a stopping service looks.
        while time.monotonic() < deadline and any(map(_busy, self.subscribers)):  # noqa: ASYNC110
            await asyncio.sleep(DRAIN_POLL_S)
        for subscriber in self.subscribers:
            await subscriber.stop()


def _busy(subscriber: ConcurrentCoreSubscriber) -> bool:
    waiting = subscriber.receive_stream.statistics().current_buffer_used
    return bool(waiting) or subscriber.limiter.value < subscriber.max_workers
