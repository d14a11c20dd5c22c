"""The NATS seam: the only module that talks to JetStream directly.

It connects (retrying while the server is not up) and publishes jobs and frames with
`Nats-Msg-Id` so a repeat is stored once. Errors are translated to runwire's own at this
boundary. Declaring streams and consumers (`streams.py`) and reading streams back
(`stream_reads.py`) are parts of the same `Broker`, in modules of their own.
"""

import asyncio
import itertools
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import nats
import nats.errors
import orjson
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from runwire.client.settings import server_urls
from runwire.contracts.frames import Frame
from runwire.contracts.headers import TRACEPARENT
from runwire.contracts.subjects import DEFAULT_INBOX, Subjects
from runwire.runtime.errors import (
    LostRace,
    PayloadTooLarge,
    QueueFull,
    RunwireError,
    Unavailable,
)
from runwire.runtime.settings import DEFAULT_NATS_PING_INTERVAL_MS
from runwire.runtime.stream_reads import HDR_POSITION, StreamReads
from runwire.runtime.streams import DECLARE_TIMEOUT_S, StreamAdmin

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 60.0
PUBLISH_TIMEOUT_S = 5.0
# How often overdue publish acknowledgements are looked for.
ACK_CHECK_S = 0.25
FRAME_HEADROOM_BYTES = 4096
PING_MAX = 3
# A subscription that falls behind drops messages, each reported: said this often at most.
SLOW_CONSUMER_LOG_S = 10.0
# A header value never carries a line break (it would end the header block).
_NO_NEWLINES = str.maketrans({"\r": " ", "\n": " "})
ERR_STREAM_FULL = 10077
ERR_MSG_TOO_LARGE = 10054
# Nats-Expected-Last-Subject-Sequence did not hold.
ERR_WRONG_LAST_SEQUENCE = 10071
HDR_EXPECTED_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
HDR_MSG_ID = "Nats-Msg-Id"
HDR_EXPECTED_STREAM = "Nats-Expected-Stream"
NO_RESPONDERS = "503"


class ChainMoved(LostRace):
    """A frame was refused: the run's last stored frame is not the one it was numbered
    after (a newer attempt, or a service closing the run, stored one first; or this
    very frame, stored by a try whose acknowledgement was lost)."""


def frame_msg_id(run_id: str, generation: int, raw_seq: int) -> str:
    """A frame's message id: its run, its attempt's generation and its place in that
    attempt's frames (two attempts never share one)."""
    return f"{run_id}:{generation}:{raw_seq}"


@dataclass(frozen=True, slots=True)
class _Awaiting:
    """A publish whose acknowledgement is awaited."""

    acked: "asyncio.Future[int]"
    subject: str
    stream: str
    sent_at: float


def _stream_seq(reply: Msg, subject: str, stream: str) -> int:
    """The stream sequence a publish acknowledgement gives, or the error it reports."""
    if (reply.headers or {}).get("Status") == NO_RESPONDERS:
        raise Unavailable(f"no stream stores {subject} (JetStream down, or {stream} missing)")
    try:
        answer = orjson.loads(reply.data)
    except orjson.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict) or not ("seq" in answer or "error" in answer):
        raise Unavailable(f"unreadable acknowledgement of a publish to {subject}")
    error = answer.get("error")
    if error is not None:
        err_code = error.get("err_code")
        if err_code == ERR_STREAM_FULL:
            raise QueueFull(f"stream {stream} is full")
        if err_code == ERR_MSG_TOO_LARGE:
            raise PayloadTooLarge(f"message too large for {stream}")
        if err_code == ERR_WRONG_LAST_SEQUENCE:
            raise ChainMoved(f"another frame was stored on {subject} first")
        raise Unavailable(
            f"JetStream refused the publish to {subject}: {error.get('description')} "
            f"(code {error.get('code')}, err_code {err_code})"
        )
    return int(answer["seq"])


def failed_publish(exc: RunwireError) -> "asyncio.Future[int]":
    """The future of a publish that could not be sent, for a caller that awaits every
    publish the same way (and sends again what failed)."""
    acked: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    _fail(acked, exc)
    return acked


def _fail(acked: "asyncio.Future[int]", exc: RunwireError) -> None:
    """Fail a publish's future. Whoever awaits it gets the error; a future nobody awaits
    any more (its caller gave up on the batch) is not an error of its own."""
    if not acked.done():
        acked.set_exception(exc)
        acked.exception()  # retrieved: no "never retrieved" warning if nobody awaits


class Broker(StreamAdmin, StreamReads):
    """A NATS connection with runwire's streams, consumers and publishes."""

    def __init__(self, nc: NatsClient, subjects: Subjects) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream(timeout=PUBLISH_TIMEOUT_S)
        # Stream declarations wait less: an unanswered one is looked at again (streams.py).
        self._declaring = nc.jetstream(timeout=DECLARE_TIMEOUT_S)
        self.subjects = subjects
        self._state = {"closing": False}
        # Publish acknowledgements: one reply subscription, a future per publish.
        self._ack_prefix = nc.new_inbox()
        self._awaiting_ack: dict[str, _Awaiting] = {}
        self._tokens = itertools.count(1)
        self._watchdog: asyncio.Task[None] | None = None

    async def _listen_for_acks(self) -> None:
        await self.nc.subscribe(f"{self._ack_prefix}.*", cb=self._on_ack)

    @classmethod
    async def connect(
        cls,
        url: str,
        subjects: Subjects,
        *,
        name: str,
        timeout: float = CONNECT_TIMEOUT_S,
        user: str | None = None,
        password: str | None = None,
        ping_interval_s: float = DEFAULT_NATS_PING_INTERVAL_MS / 1000,
        inbox: str = DEFAULT_INBOX,
        tls: ssl.SSLContext | None = None,
    ) -> "Broker":
        """Connect (as `user`, on a broker that enforces identities), retrying with
        backoff until `timeout`; then reconnect forever. Refused credentials fail at once.
        Replies (JetStream API answers, publish acknowledgements) arrive under `inbox`
        (a service's own, `_SVC_INBOX_<service>`)."""

        refused = asyncio.Event()

        dropped = {"count": 0, "said_at": float("-inf")}

        async def on_error(exc: Exception) -> None:
            if "authorization violation" in str(exc).lower():
                refused.set()
            if isinstance(exc, nats.errors.SlowConsumerError):
                # One per message dropped: said once every SLOW_CONSUMER_LOG_S, counted.
                dropped["count"] += 1
                now = asyncio.get_running_loop().time()
                if now - dropped["said_at"] >= SLOW_CONSUMER_LOG_S:
                    log.warning(
                        "messages dropped for a subscription that fell behind (%d since "
                        "last said): %s",
                        dropped["count"],
                        exc,
                    )
                    dropped.update(count=0, said_at=now)
                return
            log.warning("NATS connection error: %s", exc)

        async def on_disconnect() -> None:
            if not state["closing"]:
                log.warning("disconnected from NATS; reconnecting")

        async def on_reconnect() -> None:
            log.info("reconnected to NATS")

        state = {"closing": False}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        delay = 0.1
        while True:
            try:
                connecting = asyncio.ensure_future(
                    nats.connect(
                        server_urls(url),
                        # The first server named first: replicas spread over a cluster.
                        dont_randomize=True,
                        name=name,
                        max_reconnect_attempts=-1,
                        reconnect_time_wait=0.5,
                        connect_timeout=2,
                        error_cb=on_error,
                        disconnected_cb=on_disconnect,
                        reconnected_cb=on_reconnect,
                        user=user,
                        password=password,
                        inbox_prefix=inbox,
                        tls=tls,
                        # A server that stops answering (frozen, cut off) is left for
                        # another of the cluster after PING_MAX unanswered pings.
                        ping_interval=ping_interval_s,
                        max_outstanding_pings=PING_MAX,
                    )
                )
                gate = asyncio.ensure_future(refused.wait())
                await asyncio.wait([connecting, gate], return_when=asyncio.FIRST_COMPLETED)
                gate.cancel()
                if not connecting.done():
                    connecting.cancel()
                    raise Unavailable(
                        f"NATS at {url} refused the identity {user or '(none)'}: set "
                        "RUNWIRE_NATS_USER and RUNWIRE_NATS_PASSWORD to this service's"
                    )
                nc = connecting.result()
                broker = cls(nc, subjects)
                broker._state = state
                await broker._listen_for_acks()
                return broker
            except (OSError, nats.errors.Error) as exc:
                if loop.time() + delay > deadline:
                    raise Unavailable(f"NATS unreachable at {url}: {exc}") from exc
                log.warning("NATS not reachable yet (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    @property
    def max_frame_bytes(self) -> int:
        """The largest frame body that fits in a message, with room for the headers."""
        return int(self.nc.max_payload) - FRAME_HEADROOM_BYTES

    async def close(self) -> None:
        """Flush what is pending and close. (A drain waits on pull subscriptions for
        its whole timeout, so services finish their own work first and then close.)"""
        if self.nc.is_closed:
            return
        self._state["closing"] = True
        if self._watchdog is not None:
            self._watchdog.cancel()
        for awaiting in self._awaiting_ack.values():
            _fail(awaiting.acked, Unavailable("the NATS connection closed"))
        self._awaiting_ack.clear()
        try:
            await self.nc.flush(timeout=2)
        except (nats.errors.Error, TimeoutError) as exc:
            log.warning("pending messages not flushed at close: %s", exc)
        await self.nc.close()

    # -- publishing ---------------------------------------------------------------
    async def send(
        self,
        subject: str,
        body: bytes,
        msg_id: str,
        stream: str,
        headers: dict[str, str] | None = None,
    ) -> "asyncio.Future[int]":
        """Send a JetStream publish with a message id now; the future gives its stream
        sequence once the acknowledgement arrives (or the error: Unavailable when none
        comes within PUBLISH_TIMEOUT_S, QueueFull, PayloadTooLarge).

        The message goes with a reply subject under one inbox subscription of this
        connection: no request, task or timer per message, so that many can be sent
        before any is awaited (nats-py's `publish_async` does the same, but its reply
        handler raises on an error reply instead of failing the publish, so a full
        stream would look like a timeout). Nothing yields between the call and the
        message reaching the connection's buffer, so publishes sent in a row are stored
        in that order.
        """
        nc = self.nc
        if len(body) > nc.max_payload:
            raise PayloadTooLarge(f"message too large for {stream}")
        if nc.is_closed or nc.is_draining_pubs:
            raise Unavailable(f"publish to {subject} failed: the NATS connection is closing")
        loop = asyncio.get_running_loop()
        token = str(next(self._tokens))
        acked: asyncio.Future[int] = loop.create_future()
        block = f"NATS/1.0\r\n{HDR_MSG_ID}: {msg_id}\r\n{HDR_EXPECTED_STREAM}: {stream}\r\n"
        for key, value in (headers or {}).items():
            block += f"{key}: {value.translate(_NO_NEWLINES)}\r\n"
        header = (block + "\r\n").encode()
        # The protocol's HPUB, written here: nats-py's `publish` checks both subjects and
        # every header key with a regular expression on each call, a tenth of a relay's
        # time per frame. Subjects and keys here are runwire's own.
        command = (
            f"HPUB {subject} {self._ack_prefix}.{token} {len(header)} {len(header) + len(body)}\r\n"
        ).encode()
        self._awaiting_ack[token] = _Awaiting(acked, subject, stream, loop.time())
        try:
            await nc._send_command(command + header + body + b"\r\n")
            if nc._flush_queue is not None and nc._flush_queue.empty():
                await nc._flush_pending()
        except (nats.errors.Error, OSError) as exc:
            del self._awaiting_ack[token]
            raise Unavailable(f"publish to {subject} failed: {exc}") from exc
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = asyncio.create_task(self._expire_unacknowledged())
        return acked

    async def _on_ack(self, msg: Msg) -> None:
        awaiting = self._awaiting_ack.pop(msg.subject.rsplit(".", 1)[-1], None)
        if awaiting is None or awaiting.acked.done():
            return
        try:
            awaiting.acked.set_result(_stream_seq(msg, awaiting.subject, awaiting.stream))
        except RunwireError as exc:
            _fail(awaiting.acked, exc)

    async def _expire_unacknowledged(self) -> None:
        """Fail the publishes whose acknowledgement is overdue, while any is awaited."""
        loop = asyncio.get_running_loop()
        while self._awaiting_ack:
            await asyncio.sleep(ACK_CHECK_S)
            now = loop.time()
            overdue = [
                token
                for token, awaiting in self._awaiting_ack.items()
                if now - awaiting.sent_at >= PUBLISH_TIMEOUT_S
            ]
            for token in overdue:
                awaiting = self._awaiting_ack.pop(token)
                _fail(
                    awaiting.acked,
                    Unavailable(f"no acknowledgement of a publish to {awaiting.subject}"),
                )

    async def send_message(
        self,
        subject: str,
        stream: str,
        body: bytes,
        msg_id: str,
        *,
        traceparent: str | None = None,
    ) -> "asyncio.Future[int]":
        """Send an outbox message (a job, a closing frame, a run event) to `stream` (see
        `send`: QueueFull when the stream is at capacity). `traceparent` puts it in its
        run's trace."""
        return await self.send(
            subject,
            body,
            msg_id,
            stream,
            headers={TRACEPARENT: traceparent} if traceparent else None,
        )

    async def send_frame(
        self,
        tenant: str,
        frame: Frame,
        body: bytes,
        generation: int,
        raw_seq: int,
        after: int,
        *,
        traceparent: str | None = None,
    ) -> "asyncio.Future[int]":
        """Send a run's numbered frame (`body`: its JSON) to the frames stream, stored
        only if the run's last stored frame is stream sequence `after` (0: none is
        stored): the future gives its stream seq, or ChainMoved when another frame was
        stored on the run's subject since (see `runwire.runtime.frame_chain`)."""
        headers = {
            HDR_POSITION: f"{generation} {raw_seq} {frame.seq} {frame.type.value}",
            HDR_EXPECTED_LAST_SUBJECT_SEQ: str(after),
        }
        if traceparent:
            headers[TRACEPARENT] = traceparent
        return await self.send(
            self.subjects.frames_out(tenant, frame.run_id),
            body,
            frame_msg_id(frame.run_id, generation, raw_seq),
            self.subjects.run_frames_stream,
            headers=headers,
        )

    async def notify(self, subject: str, body: bytes = b"") -> None:
        """A core-NATS notice: fast, best effort (a fallback must exist)."""
        try:
            await self.nc.publish(subject, body)
        except (nats.errors.Error, OSError) as exc:
            log.warning("notice on %s not sent: %s", subject, exc)

    async def subscribe(
        self, subject: str, handler: Callable[[Msg], Awaitable[None]], *, queue: str = ""
    ) -> None:
        """A core-NATS subscription (commands, notices)."""
        await self.nc.subscribe(subject, queue=queue, cb=handler)
