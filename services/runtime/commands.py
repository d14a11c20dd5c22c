"""Serving request/reply commands: parse, validate, answer a result or an error.

Whatever arrives, the service answers `{ok: false, error: {code, message, retryable}}`
for bad input and keeps serving; an unexpected failure is logged with its context and
answered as UNAVAILABLE (retryable).
"""

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from nats.aio.msg import Msg
from opentelemetry.trace import SpanKind
from pydantic import BaseModel, ValidationError

from contracts.errors import ErrorBody, ErrorCode, ErrorReply
from contracts.subjects import valid_tenant
from services.runtime import tracing
from services.runtime.broker import Broker
from services.runtime.errors import InvalidRequest, NotFound, PayloadTooLarge, RunwireError
from services.runtime.logs import fields
from services.runtime.metrics import COMMAND_DURATION

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)
Handler = Callable[[str, bytes], Awaitable[BaseModel]]

# Room for the envelope around an input of the maximum size.
ENVELOPE_BYTES = 16 * 1024


def describe(exc: ValidationError) -> str:
    """A short, readable account of what is wrong with a body."""
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "body"
        parts.append(f"{where}: {err['msg']}")
    more = len(exc.errors()) - 5
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def parse(model: type[M], data: bytes, *, max_bytes: int) -> M:
    """Decode and validate a command body, raising a wire error for bad input."""
    if len(data) > max_bytes + ENVELOPE_BYTES:
        raise PayloadTooLarge(f"body of {len(data)} bytes is over the limit of {max_bytes}")
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidRequest(f"body is not JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise InvalidRequest("body must be a JSON object")
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        raise InvalidRequest(describe(exc)) from exc


class CommandServer:
    """Runs each command in its own task and always replies."""

    def __init__(self, broker: Broker, queue: str) -> None:
        self._broker = broker
        self._queue = queue
        self._tasks: set[asyncio.Task[None]] = set()

    async def serve(self, name: str, handler: Handler) -> None:
        """Answer `<prefix>.*.cmd.<name>` in the service's queue group."""
        subject = self._broker.subjects.command_wildcard(name)

        async def on_msg(msg: Msg) -> None:
            task = asyncio.create_task(self._answer(name, msg, handler))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        await self._broker.subscribe(subject, on_msg, queue=self._queue)

    async def _answer(self, name: str, msg: Msg, handler: Handler) -> None:
        started = time.monotonic()
        tenant = self._broker.subjects.tenant_of_command(msg.subject)
        # A span per command, in the caller's trace when its request carries one.
        with tracing.span(
            f"command {name}",
            tracing.context_from_headers(msg.headers),
            kind=SpanKind.SERVER,
            attributes={"tenant": tenant, "messaging.destination.name": msg.subject},
        ) as current:
            reply = await self._reply_to(name, tenant, msg, handler)
            if isinstance(reply, ErrorReply):
                tracing.failed(current, reply.error.code.value)
            if msg.reply:
                await self._send(msg.reply, reply)
        COMMAND_DURATION.labels(name).observe(time.monotonic() - started)

    async def _reply_to(self, name: str, tenant: str, msg: Msg, handler: Handler) -> BaseModel:
        reply: BaseModel
        try:
            if not valid_tenant(tenant):
                raise InvalidRequest(f"invalid tenant {tenant!r} in subject")
            reply = await handler(tenant, msg.data)
        except RunwireError as exc:
            if not isinstance(exc, InvalidRequest | PayloadTooLarge | NotFound):
                log.warning("command %s failed: %s", name, exc.message, extra=fields(code=exc.code))
            reply = ErrorReply(error=exc.body())
        except Exception:
            log.exception("command %s failed unexpectedly", name, extra=fields(tenant=tenant))
            reply = ErrorReply(
                error=ErrorBody(
                    code=ErrorCode.UNAVAILABLE,
                    message="internal error; try again",
                    retryable=True,
                )
            )
        return reply

    async def _send(self, subject: str, reply: BaseModel) -> None:
        body = reply.model_dump_json().encode()
        if len(body) > self._broker.nc.max_payload:
            body = (
                ErrorReply(
                    error=ErrorBody(
                        code=ErrorCode.PAYLOAD_TOO_LARGE,
                        message=f"the reply of {len(body)} bytes is over the message limit",
                        retryable=False,
                    )
                )
                .model_dump_json()
                .encode()
            )
        await self._broker.nc.publish(subject, body)

    async def drain(self, timeout: float = 5.0) -> None:
        """Wait for commands in progress to reply."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)
