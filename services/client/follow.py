"""Following a run: `join`, and `stream`, which yields every frame after a cursor
exactly once and in order until `done`, re-joining by itself when the connection, the
relay or the live subscription is lost; and `events`, a tenant's run events live."""

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator

import nats
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from pydantic import ValidationError

from runwire.client.connection import (
    REQUEST_TIMEOUT_S,
    STORED_FRAMES,
    ClientError,
    Connection,
    drop_request,
    parse_reply,
)
from runwire.contracts.commands import (
    JoinCommand,
)
from runwire.contracts.events import RunEvent
from runwire.contracts.frames import Frame, FrameType
from runwire.contracts.headers import REPLAY_NEXT
from runwire.contracts.replies import (
    JoinReply,
)
from runwire.contracts.subjects import Subjects

log = logging.getLogger(__name__)

REJOIN_DELAY_S = 0.2
JOIN_FIRST_TIMEOUT_S = 2.0
# With no frame for this long, the client re-joins to check the run is still alive.
LIVE_IDLE_S = 5.0
# A live-frames consumer the client no longer reads is removed by the server after this.
FOLLOW_INACTIVE_S = 10.0
# Frames held back waiting for an earlier one before the client joins again.
EARLY_LIMIT = 256
# Turns of the event loop that take a request onto the connection: the request's task,
# the one that waits for a refusal beside it, NATS's writer.
SEND_HOPS = 3
# How long a run submitted by this client may stay quiet in the stream before the
# client joins it (see `Following.stream`).
FRESH_IDLE_S = 1.0
# How long a client waits for the stream to say whether it holds a frame of a run.
LAST_FRAME_TIMEOUT_S = 1
# The status of a direct get that found no message.
NOT_FOUND = "404"


def _replay_next(msg: Msg) -> int | None:
    """The cursor a cut join reply says its rest starts after (see REPLAY_NEXT)."""
    value = (msg.headers or {}).get(REPLAY_NEXT, "")
    return int(value) if value.isdecimal() else None


async def _next(sub: Subscription, idle: float) -> Msg | None:
    """The subscription's next message, or None once it stayed quiet for `idle` seconds
    or failed. What has arrived is taken from the subscription's queue at once and only a
    wait for more is timed: nats-py's `next_msg` costs a task and a timer a message, a
    third of a client's time per frame. (Its own `next_msg` where its queue is not there.)"""
    queue: asyncio.Queue[Msg] | None = getattr(sub, "_pending_queue", None)
    if queue is None or not hasattr(sub, "_pending_size"):
        try:
            return await sub.next_msg(timeout=idle)
        except (nats.errors.TimeoutError, TimeoutError, nats.errors.Error):
            return None
    if queue.empty():
        try:
            # A timeout scope, not `wait_for`: no task per wait (a token's frame each).
            async with asyncio.timeout(idle):
                msg = await queue.get()
        except TimeoutError:
            return None
    else:
        msg = queue.get_nowait()
    queue.task_done()
    sub._pending_size -= len(msg.data)
    return msg


def _first_frame(msg: Msg, subject: str) -> Frame | None:
    """The frame of a direct get of `subject`'s last message when it is its run's first
    (a fresh run's `run` frame), else None."""
    if (msg.headers or {}).get("Status"):
        return None  # an error of the stream's, not a message
    try:
        frame = Frame.model_validate_json(msg.data, context=STORED_FRAMES)
    except ValidationError:
        return None
    if frame.seq != 1 or frame.run_id != Subjects.run_of_frames(subject):
        return None
    return frame


class Following(Connection):
    """A connection that follows runs: their frames from a cursor, their events."""

    async def join(
        self, run_id: str, after: int = 0, *, timeout: float = REQUEST_TIMEOUT_S
    ) -> JoinReply:
        reply: JoinReply = await self._request(
            "join", JoinCommand(run_id=run_id, after=after), JoinReply, timeout=timeout
        )
        return reply

    async def stream(self, run_id: str, after: int = 0) -> AsyncIterator[Frame]:
        """Every frame with `seq > after`, once each, in order, ending with `done`."""
        cursor = after
        fresh = self._fresh.pop(run_id, None) if after == 0 else None
        if fresh is not None:
            # A run this client just submitted: every frame it has is on its subject, or
            # still in the stream, from its first, so it is followed there at once and
            # the relay is not asked (see `_in_order`). A gap (frames the stream no
            # longer holds), or a quiet run, and it is joined.
            frames = self._in_order(
                fresh.subject, fresh.stream, 1, cursor, idle=FRESH_IDLE_S, live=True
            )
            async for frame in frames:
                cursor = frame.seq
                yield frame
                if frame.type == FrameType.DONE:
                    return
        failures = 0
        # The next join, already asked for: a reply cut at the relay's size limit names
        # the cursor of the rest, which is asked for while this reply is read.
        ahead: tuple[int, asyncio.Task[Msg]] | None = None
        try:
            while True:
                # Short at first, longer after each failure: a relay that stopped
                # answering (frozen) still gets its share of joins until NATS drops it,
                # and the next try most likely reaches another relay.
                timeout = min(REQUEST_TIMEOUT_S, JOIN_FIRST_TIMEOUT_S * 2**failures)
                asked, ahead = ahead, None
                try:
                    if asked is not None and asked[0] == cursor:
                        msg = await asked[1]
                    else:
                        if asked is not None:
                            drop_request(asked[1])
                        msg = await self._ask(
                            "join", JoinCommand(run_id=run_id, after=cursor), timeout
                        )
                    rest = _replay_next(msg)
                    if rest is not None and rest > cursor:
                        command = JoinCommand(run_id=run_id, after=rest)
                        ahead = (rest, asyncio.ensure_future(self._ask("join", command, timeout)))
                        # Out before this reply is read: reading it keeps the event loop
                        # for a while, and a request is only sent from the loop.
                        for _ in range(SEND_HOPS):
                            await asyncio.sleep(0)
                    reply: JoinReply = parse_reply(msg, JoinReply)
                except ClientError as exc:
                    if not exc.retryable:
                        raise
                    failures += 1
                    log.info("join failed (%s); joining again", exc.message)
                    await asyncio.sleep(REJOIN_DELAY_S)
                    continue
                failures = 0
                for frame in reply.replay:
                    if frame.seq > cursor:
                        cursor = frame.seq
                        yield frame
                        if frame.type == FrameType.DONE:
                            return
                if reply.live is None:
                    if not reply.replay:
                        run = reply.run
                        # `last_seq` is final only once the run's frames are complete.
                        if run.status.terminal and run.frames_complete and cursor >= run.last_seq:
                            return  # the caller already has every frame, `done` included
                        await asyncio.sleep(REJOIN_DELAY_S)
                    continue
                live = reply.live
                frames = self._in_order(live.subject, live.stream, live.stream_seq, cursor)
                async for frame in frames:
                    cursor = frame.seq
                    yield frame
                    if frame.type == FrameType.DONE:
                        return
        finally:
            if ahead is not None:
                drop_request(ahead[1])

    async def _in_order(
        self,
        subject: str,
        stream: str,
        start: int,
        cursor: int,
        *,
        idle: float = LIVE_IDLE_S,
        live: bool = False,
    ) -> AsyncIterator[Frame]:
        """Live frames after `cursor`, strictly by seq: one stored out of order (a publish
        the relay retried) waits for the frames before it. Ends when the subscription
        goes quiet or fails, or when a frame is missing for good (the caller joins).

        `live`: a run just submitted, of which nothing is stored yet, is followed on its
        subject itself, without a JetStream consumer: creating and removing one costs
        nats-server about 240 µs, and each frame it delivers about 19 µs more than a
        plain subscription does. The stream is read instead, from `start`, when it holds
        a frame of the run already, or once the subscription misses one (a frame comes
        ahead of it)."""
        early: dict[int, Frame] = {}
        listening = live
        source: AsyncGenerator[Frame | None, None] = (
            self._listen(subject, stream, idle)
            if live
            else self._follow(subject, stream, start, idle)
        )
        try:
            while True:
                heard = False
                async for frame in source:
                    heard = True
                    if frame is None:
                        continue  # listening: the stream held nothing of the run yet
                    if frame.seq > cursor:
                        early[frame.seq] = frame
                    if len(early) > EARLY_LIMIT:
                        return
                    while cursor + 1 in early:
                        frame = early.pop(cursor + 1)
                        cursor = frame.seq
                        yield frame
                        if frame.type == FrameType.DONE:
                            return
                    if listening and early:
                        break  # a frame ahead of one the subscription missed: in the stream
                else:
                    if not listening or heard:
                        return  # quiet (or failed): the caller joins
                await source.aclose()
                source, listening = self._follow(subject, stream, start, idle), False
        finally:
            await source.aclose()

    async def _listen(
        self, subject: str, stream: str, idle: float
    ) -> AsyncGenerator[Frame | None, None]:
        """Frames as the stream stores them on `subject`, through a plain subscription to
        its live subject (where the stream republishes each), until
        it stays quiet for `idle` or fails; first None once the subscription is in place
        and the stream holds no frame of the subject before it. The stream's last frame
        of the subject, asked for once the subscription is in place, comes first when
        it is the run's first (stored before the subscription: an attempt that started
        at once); a later one means frames before it were missed, and nothing at all is
        yielded then, or when the stream cannot tell: the caller reads the stream."""
        try:
            # What the stream stored, as it stores it (it republishes each frame there).
            sub = await self.nc.subscribe(Subjects.live_of(subject))
        except nats.errors.Error as exc:
            log.info("live subscription failed (%s); reading the stream", exc)
            return
        try:
            try:
                await self.nc.flush(timeout=LAST_FRAME_TIMEOUT_S)  # in place on the server
                # The server's own API, which a tenant may ask for the last message of
                # one of its subjects (the subject form; no hop through the submitter:
                # this is on the way to a fresh run's first frame).
                last = await self._send(
                    f"$JS.API.DIRECT.GET.{stream}.{subject}", b"", None, LAST_FRAME_TIMEOUT_S
                )
            except (nats.errors.Error, ClientError, TimeoutError) as exc:
                log.info("the stream did not say what it holds (%s); reading it", exc)
                return
            stored = None
            if (last.headers or {}).get("Status") != NOT_FOUND:
                stored = _first_frame(last, subject)
                if stored is None:
                    return
            yield None
            if stored is not None:
                yield stored  # any later frame comes on the subscription
            async for frame in self._frames_on(sub, subject, idle):
                yield frame
        finally:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()

    async def events(self, run_id: str = "*") -> AsyncIterator[RunEvent]:
        """Follow run events of this tenant live (all runs, or one). The subscription is
        in place when this returns: `async for event in await client.events(): ...`."""
        sub = await self.nc.subscribe(self.subjects.events(self.tenant, run_id))
        await self.nc.flush()

        async def follow() -> AsyncIterator[RunEvent]:
            try:
                async for msg in sub.messages:
                    try:
                        yield RunEvent.model_validate_json(msg.data)
                    except ValidationError:
                        log.warning("malformed run event on %s skipped", msg.subject)
            finally:
                with contextlib.suppress(nats.errors.Error):
                    await sub.unsubscribe()

        return follow()

    async def _follow(
        self, subject: str, stream: str, start: int, idle: float
    ) -> AsyncGenerator[Frame, None]:
        """Live frames from a stream position, until the subscription goes quiet or fails.

        Through a consumer of its own, filtered to the run's subject and created through
        the tenant's JetStream API prefix (the submitter lets a tenant create only
        consumers filtered to its own runs). Unacknowledged, in memory, and removed by the
        server once unused."""
        js = self.nc.jetstream(prefix=self.subjects.jetstream_api(self.tenant))
        inbox = self.nc.new_inbox()
        try:
            sub = await self.nc.subscribe(inbox)
        except nats.errors.Error as exc:
            log.info("live subscription failed (%s); joining again", exc)
            return
        try:
            await js.add_consumer(
                stream,
                ConsumerConfig(
                    name=f"follow-{uuid.uuid4().hex}",
                    filter_subject=subject,
                    deliver_subject=inbox,
                    deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                    opt_start_seq=start,
                    ack_policy=AckPolicy.NONE,
                    inactive_threshold=FOLLOW_INACTIVE_S,
                    mem_storage=True,
                    num_replicas=1,
                ),
            )
        except (nats.errors.Error, nats.js.errors.Error, OSError) as exc:
            log.info("live subscription failed (%s); joining again", exc)
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
            return
        try:
            async for frame in self._frames_on(sub, subject, idle):
                yield frame
        finally:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()

    async def _frames_on(
        self, sub: Subscription, subject: str, idle: float
    ) -> AsyncGenerator[Frame, None]:
        """The frames `sub` receives, until it stays quiet for `idle` or the connection
        closes (the caller re-joins to learn whether the run goes on)."""
        run_id = Subjects.run_of_frames(subject)
        while not self.nc.is_closed:
            msg = await _next(sub, idle)
            if msg is None:
                return
            try:
                frame = Frame.model_validate_json(msg.data, context=STORED_FRAMES)
            except ValidationError:
                log.warning("malformed frame on %s skipped", subject)
                continue
            if frame.run_id != run_id:
                # Another run's frame, delivered here by someone's consumer (the broker
                # lets a consumer deliver to any subject): never part of this run.
                log.warning("a frame of another run on %s skipped", subject)
                continue
            yield frame
