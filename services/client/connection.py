"""A connection to runwire for one tenant: commands sent as requests, their replies and
errors, and what a broker that enforces identities refuses. `Client` (sdk.py) is this,
with its commands and the following of runs (follow.py)."""

import asyncio
import contextlib
import gc
import logging
import re
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any, Self

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from opentelemetry import propagate
from pydantic import BaseModel, ValidationError

from runwire.contracts.errors import ErrorBody, ErrorCode, ErrorReply
from runwire.contracts.frames import CHECKED
from runwire.contracts.replies import (
    FrameChannel,
)
from runwire.contracts.subjects import Subjects

log = logging.getLogger(__name__)

# Validation context for what runwire's relay sends: frames it stored after their data
# was checked (see `runwire.contracts.frames.CHECKED`).
STORED_FRAMES = {CHECKED: True}
# A reply this large (a long replay: some 10k frames per MB) is parsed with the garbage
# collector paused: its objects all live on, and collections triggered by making them
# (a full one among them, in a process holding many objects) doubled a replay's time.
LARGE_REPLY_BYTES = 256 * 1024
REQUEST_TIMEOUT_S = 10.0

# How the broker says no (nats-server's -ERR line): the operation and its subject.
_VIOLATION = re.compile(r"permissions violation for (publish|subscription) to \"?([^\"']+)", re.I)


class Refusals:
    """The broker's refusals on one connection, as they arrive (asynchronously: a publish
    it refuses is dropped, and the connection hears why a moment later)."""

    def __init__(self) -> None:
        self._waiting: dict[str, list[asyncio.Future[str]]] = {}
        # Set when the broker refused the connection's credentials.
        self.credentials_refused = asyncio.Event()

    async def on_error(self, exc: Exception) -> None:
        if "authorization violation" in str(exc).lower():
            self.credentials_refused.set()
            return
        found = _VIOLATION.search(str(exc))
        if found is None:
            # nats-py prints a traceback for every failed attempt by default; one line.
            log.debug("NATS connection error: %s", exc)
            return
        subject = found.group(2).strip()
        for future in self._waiting.pop(subject, []):
            if not future.done():
                action = "publish" if found.group(1).lower() == "publish" else "subscribe"
                future.set_result(f"the broker does not let this identity {action} to {subject}")

    def watch(self, subject: str) -> "asyncio.Future[str]":
        """A future set when the broker refuses an operation on `subject`."""
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(subject, []).append(future)
        return future

    def forget(self, subject: str, future: "asyncio.Future[str]") -> None:
        waiting = self._waiting.get(subject, [])
        if future in waiting:
            waiting.remove(future)
        if not waiting:
            self._waiting.pop(subject, None)


def unauthorized(message: str) -> "ClientError":
    return ClientError(ErrorBody(code=ErrorCode.UNAUTHORIZED, message=message, retryable=False))


class ClientError(Exception):
    """A command answered with an error, or no service answered."""

    def __init__(self, error: ErrorBody) -> None:
        super().__init__(f"{error.code}: {error.message}")
        self.error = error
        self.code = error.code
        self.message = error.message
        self.retryable = error.retryable


@contextlib.contextmanager
def _collections_paused(pause: bool) -> Iterator[None]:
    """The garbage collector paused for the block when `pause` and it runs (as it was
    after: a caller that disabled it keeps it disabled).

    What the block made (a long replay's frames: tens of thousands of objects) is then
    handed to the oldest generation as it is: the next young collection would otherwise
    scan it all at once (5 ms for 10k frames) only to find it alive. (The program's
    other young objects go with it: a garbage cycle among them waits for the next full
    collection.) Not when the program keeps objects frozen (`gc.freeze`, as pre-forking
    servers do): that freeze is left as it is."""
    if not pause or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
        if gc.get_freeze_count() == 0:
            gc.freeze()
            gc.unfreeze()
    finally:
        gc.enable()


def parse_reply(msg: Msg, reply: type[Any]) -> Any:
    """A reply message as `reply`, or the ClientError of the error it carries."""
    try:
        # Frames in a reply come from the relay, which only stores frames whose data was
        # checked when they were made: their data is not checked again.
        with _collections_paused(len(msg.data) >= LARGE_REPLY_BYTES):
            return reply.model_validate_json(msg.data, context=STORED_FRAMES)
    except ValidationError:
        raise ClientError(ErrorReply.model_validate_json(msg.data).error) from None


def drop_request(task: asyncio.Task[Any]) -> None:
    """A request no longer wanted: cancelled, or its outcome taken (an error included)."""
    if not task.cancel() and not task.cancelled():
        task.exception()


class Connection:
    """A connection to runwire for one tenant: its requests and their replies."""

    def __init__(
        self, nc: NatsClient, *, tenant: str, prefix: str, refusals: Refusals | None = None
    ) -> None:
        self.nc = nc
        self.tenant = tenant
        # The broker's refusals, on a connection with an identity (a broker without
        # authentication refuses nothing: requests are not watched for it).
        self._refusals = refusals
        self.subjects = Subjects(prefix)
        # Runs this client submitted lately, whose frames are all still in the stream:
        # the first `stream` of one follows the stream from its first frame at once,
        # without a join (run id → where its frames are).
        self._fresh: OrderedDict[str, FrameChannel] = OrderedDict()

    async def close(self) -> None:
        """Close the connection; one the server dropped closes quietly too (what was
        still to be sent is lost with it)."""
        if not self.nc.is_closed:
            # nats-py closes a connection that is reconnecting by flushing what is
            # pending into the lost socket, and raises that socket's error.
            with contextlib.suppress(OSError):
                await self.nc.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _send(
        self, subject: str, data: bytes, headers: dict[str, str] | None, timeout: float
    ) -> Msg:
        """A request's reply; on a broker that enforces identities, UNAUTHORIZED as soon
        as it says it dropped the request."""
        if self._refusals is None:
            return await self.nc.request(subject, data, headers=headers, timeout=timeout)
        refused = self._refusals.watch(subject)
        request = asyncio.ensure_future(
            self.nc.request(subject, data, headers=headers, timeout=timeout)
        )
        try:
            waiting: list[asyncio.Future[Any]] = [request, refused]
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if refused.done() and not request.done():
                request.cancel()
                raise unauthorized(refused.result())
            return await request
        finally:
            self._refusals.forget(subject, refused)

    async def _request(
        self, name: str, body: BaseModel, reply: type[Any], *, timeout: float = REQUEST_TIMEOUT_S
    ) -> Any:
        return parse_reply(await self._ask(name, body, timeout), reply)

    async def _ask(self, name: str, body: BaseModel, timeout: float) -> Msg:
        """The reply message of a command request, not yet read."""
        subject = self.subjects.command(self.tenant, name)
        # The caller's trace context, when it traces: a submitted run joins its trace.
        headers: dict[str, str] = {}
        propagate.inject(headers)
        data = body.model_dump_json(exclude_unset=True).encode()
        try:
            return await self._send(subject, data, headers or None, timeout)
        except nats.errors.NoRespondersError as exc:
            raise ClientError(
                ErrorBody(
                    code=ErrorCode.UNAVAILABLE,
                    message=f"no service answers {subject}",
                    retryable=True,
                )
            ) from exc
        except (nats.errors.TimeoutError, TimeoutError) as exc:
            raise ClientError(
                ErrorBody(
                    code=ErrorCode.UNAVAILABLE,
                    message=f"no reply on {subject} within {timeout}s",
                    retryable=True,
                )
            ) from exc
