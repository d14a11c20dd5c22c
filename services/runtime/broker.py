"""The NATS seam: the only module that talks to JetStream directly.

It connects (retrying while the server is not up), declares the streams and durable
consumers from settings, and publishes jobs and frames with `Nats-Msg-Id` so a repeat
is stored once. Errors are translated to runwire's own at this boundary.
"""

import asyncio
import itertools
import json
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import NamedTuple

import nats
import nats.errors
import nats.js.errors
import orjson
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    ConsumerInfo,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    SubjectTransform,
)

from runwire.client.settings import server_urls
from runwire.contracts.frames import Frame, RawFrame
from runwire.contracts.headers import TRACEPARENT
from runwire.contracts.subjects import DEFAULT_INBOX, Subjects
from runwire.runtime.errors import PayloadTooLarge, QueueFull, RunwireError, Unavailable
from runwire.runtime.settings import (
    DEFAULT_FRAME_FOLLOWERS,
    DEFAULT_NATS_PING_INTERVAL_MS,
    CommonSettings,
)
from runwire.runtime.tokens import raw_frame_id

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 60.0
PUBLISH_TIMEOUT_S = 5.0
# How often overdue publish acknowledgements are looked for.
ACK_CHECK_S = 0.25
DUPLICATE_WINDOW_S = 120.0
FRAME_HEADROOM_BYTES = 4096
DECLARE_TRIES = 8
# How many of a run's stored raw frames `raw_frames_on` looks at.
RAW_LOOK_LIMIT = 256
# A Direct Get answered by a replica behind the stream's leader is asked again this many
# times, after READ_BEHIND_DELAY_S times the tries so far (about 2 s in all).
READ_BEHIND_TRIES = 12
READ_BEHIND_DELAY_S = 0.03
PING_MAX = 3
# The most consumers the server lists in one answer.
CONSUMER_PAGE = 256
DECLARE_TIMEOUT_S = 1.0
EVENTS_MAX_AGE_S = 7 * 24 * 3600
# A header value never carries a line break (it would end the header block).
_NO_NEWLINES = str.maketrans({"\r": " ", "\n": " "})
ERR_STREAM_FULL = 10077
ERR_MSG_TOO_LARGE = 10054
# The executors' durable consumers on the jobs stream: `executor-<runner>`, one per runner.
# (Before per-runner jobs, one consumer named just `executor` took every job.)
EXECUTOR_CONSUMER = "executor"
# Raw frames are split into this many partitions by a hash of the run id. Changing it
# moves runs between partitions: only do so with no run in flight.
RELAY_PARTITIONS = 16


def relay_consumer(partition: int) -> str:
    """The durable consumer of one raw-frames partition."""
    return f"relay-{partition}"


HDR_MSG_ID = "Nats-Msg-Id"
HDR_EXPECTED_STREAM = "Nats-Expected-Stream"
NO_RESPONDERS = "503"
# Where a client frame stands, in one header of the message the relay published it in:
# "<generation> <raw seq> <seq> <type>" (the relay's position in the run, read back when
# it takes a run up again). One header, not four: every client parses every header of
# every frame it receives, and they were larger than a token's frame.
HDR_POSITION = "Rw-Pos"
# The four headers of frames published before runwire packed them (still read).
HDR_GENERATION = "Rw-Generation"
HDR_RAW_SEQ = "Rw-Raw-Seq"
HDR_FRAME_SEQ = "Rw-Seq"
HDR_FRAME_TYPE = "Rw-Type"


@dataclass(frozen=True, slots=True)
class StreamLimits:
    """Stream settings every service declares alike (create-or-update at start-up)."""

    queue_capacity: int
    frame_max_age_s: int
    replicas: int = 1
    frame_followers: int = DEFAULT_FRAME_FOLLOWERS

    @classmethod
    def of(cls, settings: CommonSettings) -> "StreamLimits":
        return cls(
            settings.queue_capacity,
            settings.frame_stream_max_age_s,
            settings.stream_replicas,
            settings.max_frame_followers,
        )


@dataclass(frozen=True, slots=True)
class _Awaiting:
    """A publish whose acknowledgement is awaited."""

    acked: "asyncio.Future[int]"
    subject: str
    stream: str
    sent_at: float


@dataclass(frozen=True, slots=True)
class StoredMsg:
    """A message read back from a stream: its stream sequence, headers and body."""

    stream_seq: int
    headers: dict[str, str]
    data: bytes


class FramePosition(NamedTuple):
    """A published client frame's place: its attempt, its seq in the attempt, its seq in
    the run, its type."""

    generation: int
    raw_seq: int
    seq: int
    type: str


def frame_position(headers: dict[str, str]) -> FramePosition | None:
    """The position a client frame was published with; None for a message that has none
    (or a damaged one)."""
    try:
        packed = headers.get(HDR_POSITION)
        if packed is not None:
            generation, raw_seq, seq, type = packed.split(" ")
            return FramePosition(int(generation), int(raw_seq), int(seq), type)
        if HDR_GENERATION in headers:
            return FramePosition(
                int(headers[HDR_GENERATION]),
                int(headers[HDR_RAW_SEQ]),
                int(headers[HDR_FRAME_SEQ]),
                headers.get(HDR_FRAME_TYPE, ""),
            )
    except (KeyError, ValueError):
        pass
    return None


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


class Broker:
    """A NATS connection with runwire's streams, consumers and publishes."""

    def __init__(self, nc: NatsClient, subjects: Subjects) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream(timeout=PUBLISH_TIMEOUT_S)
        # Stream declarations wait less: an unanswered one is looked at again (below).
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

        async def on_error(exc: Exception) -> None:
            if "authorization violation" in str(exc).lower():
                refused.set()
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

    # -- streams and consumers -------------------------------------------------
    async def ensure_streams(self, limits: "StreamLimits") -> None:
        """Create or update the jobs, raw frames and client frames streams."""
        s = self.subjects
        queue_capacity, frame_max_age_s = limits.queue_capacity, limits.frame_max_age_s
        replicas = limits.replicas
        await self._ensure_stream(
            StreamConfig(
                name=s.jobs_stream,
                subjects=[s.jobs_wildcard],
                retention=RetentionPolicy.WORK_QUEUE,
                max_msgs=queue_capacity,
                discard=DiscardPolicy.NEW,
                storage=StorageType.FILE,
                duplicate_window=DUPLICATE_WINDOW_S,
                num_replicas=replicas,
            )
        )
        await self._ensure_stream(
            StreamConfig(
                name=s.frames_in_stream,
                subjects=[s.frames_in_wildcard],
                # Stored under a partition token derived from the run id, so that each
                # partition has one consumer and one relay at a time: a run's frames stay
                # in order while several relays share the work.
                subject_transform=SubjectTransform(
                    src=s.frames_in_wildcard, dest=s.frames_in_partitioned(RELAY_PARTITIONS)
                ),
                retention=RetentionPolicy.WORK_QUEUE,
                discard=DiscardPolicy.NEW,
                storage=StorageType.FILE,
                duplicate_window=DUPLICATE_WINDOW_S,
                num_replicas=replicas,
            )
        )
        await self._ensure_stream(
            StreamConfig(
                name=s.events_stream,
                subjects=[s.events_wildcard],
                retention=RetentionPolicy.LIMITS,
                max_age=float(EVENTS_MAX_AGE_S),
                storage=StorageType.FILE,
                duplicate_window=DUPLICATE_WINDOW_S,
                num_replicas=replicas,
            )
        )
        await self._ensure_stream(
            StreamConfig(
                name=s.run_frames_stream,
                subjects=[s.run_frames_wildcard],
                retention=RetentionPolicy.LIMITS,
                max_age=float(frame_max_age_s),
                storage=StorageType.FILE,
                duplicate_window=DUPLICATE_WINDOW_S,
                num_replicas=replicas,
                allow_direct=True,
                # Each client following a run live is a consumer of this stream (kept a
                # few seconds after it stops following). Left unset, nats-server 2.15
                # refuses the 1001st, and every later follower falls back to joins.
                max_consumers=limits.frame_followers,
            )
        )

    async def _ensure_stream(self, config: StreamConfig) -> None:
        try:
            await self._declare_stream(config)
        except (nats.errors.Error, nats.js.errors.Error, OSError) as exc:
            raise Unavailable(f"cannot declare stream {config.name}: {exc}") from exc

    async def _declare_stream(self, config: StreamConfig) -> None:
        assert config.name is not None
        # Several services declare the same streams as they start: create it, or update
        # it if it exists; a race with another declaration is settled by trying again.
        for attempt in range(DECLARE_TRIES):
            try:
                try:
                    await self._declaring.stream_info(config.name)
                except nats.js.errors.NotFoundError:
                    await self._declaring.add_stream(config)
                    return
                await self._declaring.update_stream(config)
                return
            except (nats.js.errors.APIError, nats.errors.TimeoutError):
                # On a cluster the meta leader leaves a create unanswered while another
                # replica's create of the same stream is under way: look again.
                if attempt == DECLARE_TRIES - 1:
                    raise
                await asyncio.sleep(0.05 * (attempt + 1))

    async def ensure_consumer(
        self,
        stream: str,
        durable: str,
        *,
        max_ack_pending: int,
        ack_wait_s: float,
        filter_subject: str | None = None,
    ) -> None:
        """Create or reconcile a durable pull consumer from settings (full config)."""
        await self.js.add_consumer(
            stream,
            ConsumerConfig(
                durable_name=durable,
                ack_policy=AckPolicy.EXPLICIT,
                ack_wait=ack_wait_s,
                max_ack_pending=max_ack_pending,
                max_deliver=-1,
                max_waiting=512,
                filter_subject=filter_subject,
            ),
        )

    async def delete_consumer(self, stream: str, durable: str) -> bool:
        """Remove a consumer if it exists; True when one was removed."""
        try:
            return bool(await self.js.delete_consumer(stream, durable))
        except nats.js.errors.NotFoundError:
            return False

    async def consumers_of(self, stream: str) -> list[ConsumerInfo]:
        """Every consumer of `stream`, with its configuration (read a page at a time)."""
        found: list[ConsumerInfo] = []
        try:
            while True:
                page = await self.js.consumers_info(stream, offset=len(found) or None)
                found += page
                if len(page) < CONSUMER_PAGE:
                    return found
        except (nats.errors.Error, nats.js.errors.Error, OSError) as exc:
            raise Unavailable(f"listing the consumers of {stream} failed: {exc}") from exc

    async def consumer_of(self, stream: str, name: str) -> ConsumerInfo | None:
        """One consumer of `stream` with its configuration; None if there is none."""
        try:
            info: ConsumerInfo = await self.js.consumer_info(stream, name)
        except nats.js.errors.NotFoundError:
            return None
        except (nats.errors.Error, nats.js.errors.Error, OSError) as exc:
            raise Unavailable(f"reading consumer {name} of {stream} failed: {exc}") from exc
        return info

    async def pull(self, stream: str, durable: str) -> JetStreamContext.PullSubscription:
        return await self.js.pull_subscribe_bind(durable=durable, stream=stream)

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

    async def send_raw_frame(
        self, frame: RawFrame, body: bytes | None = None, *, traceparent: str | None = None
    ) -> "asyncio.Future[int]":
        """Send an attempt's frame (`body`: its JSON, when the caller has it already;
        `traceparent`: the span that made it, for the relay's spans); see `send`."""
        return await self.send(
            self.subjects.frames_in(frame.tenant, frame.run_id),
            body if body is not None else frame.model_dump_json().encode(),
            raw_frame_id(frame.run_id, frame.generation, frame.seq, frame.token),
            self.subjects.frames_in_stream,
            headers={TRACEPARENT: traceparent} if traceparent else None,
        )

    async def publish_raw_frame(
        self, frame: RawFrame, body: bytes | None = None, *, traceparent: str | None = None
    ) -> None:
        """`send_raw_frame`, and wait until the frame is stored."""
        await (await self.send_raw_frame(frame, body, traceparent=traceparent))

    async def send_client_frame(
        self, tenant: str, frame: Frame, body: bytes, generation: int, raw_seq: int
    ) -> "asyncio.Future[int]":
        """Send a numbered frame (`body`: its JSON) on the run's client subject; the
        future gives its stream seq (see `send`)."""
        return await self.send(
            self.subjects.run_frames(tenant, frame.run_id),
            body,
            f"{frame.run_id}:{frame.seq}",
            self.subjects.run_frames_stream,
            headers={HDR_POSITION: f"{generation} {raw_seq} {frame.seq} {frame.type.value}"},
        )

    async def publish_client_frame(
        self, tenant: str, frame: Frame, body: bytes, generation: int, raw_seq: int
    ) -> int:
        """`send_client_frame`, and wait until the frame is stored; its stream seq."""
        return await (await self.send_client_frame(tenant, frame, body, generation, raw_seq))

    async def notify(self, subject: str, body: bytes = b"") -> None:
        """A core-NATS notice: fast, best effort (a fallback must exist)."""
        try:
            await self.nc.publish(subject, body)
        except (nats.errors.Error, OSError) as exc:
            log.warning("notice on %s not sent: %s", subject, exc)

    # -- reading a run's frames back ---------------------------------------------
    async def last_on_subject(self, stream: str, subject: str) -> StoredMsg | None:
        """The newest message on a subject, or None if the stream holds none."""
        try:
            raw = await self.js.get_last_msg(stream, subject)
        except nats.js.errors.NotFoundError:
            return None
        except (nats.errors.Error, nats.js.errors.Error, OSError) as exc:
            raise Unavailable(f"reading {subject} failed: {exc}") from exc
        headers = {k: str(v) for k, v in (raw.headers or {}).items()}
        return StoredMsg(int(raw.seq or 0), headers, raw.data or b"")

    async def jobs_waiting(self) -> set[str] | None:
        """Run ids with a job in the jobs stream, from one stream info request; None when
        the answer is incomplete (more subjects than one reply holds) or unavailable,
        and `job_queued` must be asked run by run."""
        jobs = await self.jobs_by_run()
        return None if jobs is None else set(jobs)

    async def served_runners(self) -> set[str] | None:
        """The runners whose jobs some executor takes: those with a consumer on the jobs
        stream (an executor declares its runners' consumers as it starts; a durable one
        stays while the executors are away). None when the stream cannot be asked."""
        try:
            consumers = await self.js.consumers_info(self.subjects.jobs_stream)
        except (nats.errors.Error, nats.js.errors.Error, OSError) as exc:
            log.warning("the jobs stream's consumers not listed: %s", exc)
            return None
        served: set[str] = set()
        for consumer in consumers:
            config = consumer.config
            for subject in [config.filter_subject, *(config.filter_subjects or [])]:
                if subject:
                    # `<prefix>.jobs.<runner>.*.job`, the filter of `jobs_of(runner)`.
                    served.add(subject.split(".")[-3])
        return served

    async def drop_job(self, runner: str, run_id: str) -> None:
        """Remove a run's job from the jobs stream (a run that ended without an attempt:
        no executor may be there to take it, and it would hold a place of the queue)."""
        await self.purge_subject(self.subjects.jobs_stream, self.subjects.job(runner, run_id))

    async def jobs_by_run(self) -> dict[str, str] | None:
        """Run id → runner of every job in the jobs stream, from one stream info request;
        None when the answer is incomplete or unavailable (see `jobs_waiting`)."""
        try:
            info = await self.js.stream_info(
                self.subjects.jobs_stream, subjects_filter=self.subjects.jobs_wildcard
            )
        except (nats.errors.Error, nats.js.errors.Error, OSError) as exc:
            log.warning("jobs stream not listed: %s", exc)
            return None
        subjects = info.state.subjects or {}
        if sum(subjects.values()) < info.state.messages:
            return None
        # `<prefix>.jobs.<runner>.<run_id>.job`
        return {subject.split(".")[-2]: subject.split(".")[-3] for subject in subjects}

    async def job_queued(self, runner: str, run_id: str) -> bool:
        """Whether the jobs stream still holds a job of this run."""
        last = await self.last_on_subject(
            self.subjects.jobs_stream, self.subjects.job(runner, run_id)
        )
        return last is not None

    async def raw_frames_on(
        self, stream: str, subject: str, before: int | None = None
    ) -> list[tuple[int, int, int]] | None:
        """(stream sequence, generation, seq) of every raw frame still stored on one
        run's subject (only those ahead of stream sequence `before`, when given), oldest
        first; None past RAW_LOOK_LIMIT of them (too many to look at one by one). Read
        one message at a time: this is for a run's rare moments (a new generation's first
        frame, a gap given up on), not for every frame."""
        found: list[tuple[int, int, int]] = []
        seq = 1
        while len(found) < RAW_LOOK_LIMIT:
            try:
                stored = await self.js.get_msg(stream, seq=seq, subject=subject, next=True)
            except nats.js.errors.NotFoundError:
                return found
            except (nats.errors.Error, nats.js.errors.Error, OSError) as exc:
                raise Unavailable(f"reading {subject} failed: {exc}") from exc
            at = int(stored.seq or 0)
            if before is not None and at >= before:
                return found
            try:
                body = json.loads(stored.data or b"{}")
                found.append((at, int(body.get("generation", 0)), int(body.get("seq", 0))))
            except (ValueError, TypeError, AttributeError):
                pass  # unreadable: the consumer refuses it; it holds nothing up
            seq = at + 1
        return None

    async def purge_subject(self, stream: str, subject: str) -> None:
        """Drop every message of one subject from a stream."""
        try:
            await self.js.purge_stream(stream, subject=subject)
        except (nats.errors.Error, nats.js.errors.Error, OSError) as exc:
            raise Unavailable(f"purging {subject} failed: {exc}") from exc

    async def last_stream_seq(self, stream: str) -> int:
        try:
            info = await self.js.stream_info(stream)
        except (nats.errors.Error, nats.js.errors.Error, OSError) as exc:
            raise Unavailable(f"stream {stream} unavailable: {exc}") from exc
        return int(info.state.last_seq)

    async def read_subject(
        self, stream: str, subject: str, start_seq: int, end_seq: int, *, batch: int = 1000
    ) -> list[StoredMsg]:
        """Every message on `subject` with stream seq in [start_seq, end_seq], where
        `end_seq` is a message on the subject read from the stream's leader (its last).

        Uses the server's batched Direct Get (one request per `batch` messages), which
        nats-py does not wrap: replies stream to an inbox and end with a 204 status. On a
        cluster every replica of the stream answers Direct Gets, and one that is behind
        the leader (just restarted, or slow) answers without the newest messages: a read
        that ends before `end_seq` is made again, until it reaches it or
        READ_BEHIND_TRIES have failed (Unavailable).
        """
        found: list[StoredMsg] = []
        seq = start_seq
        behind = 0
        while seq <= end_seq:
            got = await self._direct_get_batch(stream, subject, seq, batch)
            for m in got:
                if m.stream_seq > end_seq:
                    return found
                found.append(m)
            if len(got) == batch:
                seq = got[-1].stream_seq + 1
                continue
            if got and got[-1].stream_seq == end_seq:
                break
            behind += 1
            if behind >= READ_BEHIND_TRIES:
                raise Unavailable(
                    f"reading {subject} from {stream}: the replica that answers has not "
                    f"stored stream seq {end_seq} yet"
                )
            if got:
                seq = got[-1].stream_seq + 1
            await asyncio.sleep(READ_BEHIND_DELAY_S * behind)
        return found

    async def _direct_get_batch(
        self, stream: str, subject: str, seq: int, batch: int
    ) -> list[StoredMsg]:
        inbox = self.nc.new_inbox()
        out: list[StoredMsg] = []
        finished = asyncio.Event()

        async def collect(msg: Msg) -> None:
            headers = msg.headers or {}
            status = headers.get("Status")
            if status is not None:
                finished.set()  # 204 end of batch, or 404 nothing at/after seq
                return
            out.append(StoredMsg(int(headers.get("Nats-Sequence", "0")), headers, msg.data))

        sub = await self.nc.subscribe(inbox, cb=collect)
        try:
            request = {"seq": seq, "next_by_subj": subject, "batch": batch}
            await self.nc.publish(
                f"$JS.API.DIRECT.GET.{stream}", json.dumps(request).encode(), reply=inbox
            )
            await asyncio.wait_for(finished.wait(), timeout=PUBLISH_TIMEOUT_S)
        except TimeoutError as exc:
            raise Unavailable(f"reading {subject} from {stream} timed out") from exc
        finally:
            await sub.unsubscribe()
        return out

    async def subscribe(
        self, subject: str, handler: Callable[[Msg], Awaitable[None]], *, queue: str = ""
    ) -> None:
        """A core-NATS subscription (commands, notices)."""
        await self.nc.subscribe(subject, queue=queue, cb=handler)
