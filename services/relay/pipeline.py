"""The relay pipeline: raw frames in, ordered client frames out, segments in Postgres.

Each kept frame is published at once on the run's client subject (low latency) and
buffered for Postgres (`segments.py`); buffers are flushed every `segment_flush_ms`, when they pass
`segment_bytes`, and at once for `run`, tool, `error` and `done` frames, as one
multi-row write per flush. A raw frame is acknowledged only once its segment is written:
frames a crashed relay had published but not written come back to the partition's next
owner, which finds them published already and repairs the run's segments from the
stream when the run's `done` shows frames missing.

Our own consumers, not FastStream subscribers: a partition's consumer runs only while
this relay holds the partition's Postgres advisory lock (`partitions.py`), and a batch
of frames is published pipelined and acknowledged only after its flush; a FastStream
subscriber lives as long as the application and settles messages one by one.
"""

import asyncio
import contextlib
import hmac
import logging
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from datetime import UTC, datetime

from nats.aio.msg import Msg
from pydantic import ValidationError

from runwire.contracts.frames import URGENT_FRAME_TYPES, Frame, FrameType, RawFrame
from runwire.relay.partitions import PartitionOwner
from runwire.relay.segments import SegmentWriter
from runwire.relay.sequencer import RunCursor, Verdict
from runwire.runtime.broker import Broker, failed_publish
from runwire.runtime.consumer import DurablePull
from runwire.runtime.errors import RunwireError
from runwire.runtime.logs import bind, fields
from runwire.runtime.metrics import FRAMES_RELAYED, RELAY_LAG
from runwire.runtime.settings import RelaySettings
from runwire.runtime.storable import NUL_ESCAPE, storable
from runwire.runtime.store import FrameState, Store
from runwire.runtime.stream_reads import StoredMsg, frame_position
from runwire.runtime.streams import RELAY_PARTITIONS, StreamLimits, relay_consumer
from runwire.runtime.tokens import authentic

log = logging.getLogger(__name__)

FETCH_BATCH = 256
PUBLISH_TRIES = 4
# The single consumer of earlier versions; it would overlap the partition consumers.
LEGACY_CONSUMER = "relay"
RAW_FRAMES_IN_FLIGHT = 10_000
GAP_RETRY_DELAY_S = 0.25
OWNER_CHECK_S = 0.05
# The generation of a run's first attempt (a run is created with generation 0, and each
# claim, or closing by recovery, adds one): no raw frame of a run is older than it.
FIRST_GENERATION = 1
# Short, so that frames a crashed relay had fetched come back quickly to the next one.
RAW_FRAME_ACK_WAIT_S = 5.0
# After this many deliveries (well past the ack wait, when every frame a crashed relay
# held has come back) a frame that follows a gap is kept: the gap is lost for good.
GAP_GIVE_UP_DELIVERIES = int(4 * RAW_FRAME_ACK_WAIT_S / GAP_RETRY_DELAY_S)


@dataclass
class Pending:
    """A kept frame whose publish is under way."""

    msg: Msg
    raw: RawFrame
    frame: Frame
    body: str
    publish: "asyncio.Future[int]"


def _cursor_from(last: StoredMsg | None, state: FrameState | None) -> RunCursor:
    """A run's cursor from the last frame published for it, or, when the stream no longer
    holds any (purged after the run ended), from Postgres (last seq, frames closed); and
    what Postgres says of the run's attempts (None: no such run)."""
    position = frame_position(last.headers) if last is not None else None
    if position is not None:
        cursor = RunCursor(
            generation=position.generation,
            raw_seq=position.raw_seq,
            seq=position.seq,
            closed=position.type == FrameType.DONE.value,
        )
    else:
        cursor = RunCursor(
            seq=state.last_seq if state else 0, closed=state.closed if state else False
        )
    _know(cursor, state)
    return cursor


def _new(state: FrameState | None) -> bool:
    """Whether Postgres says that only the run's first attempt ever ran and no frame of it
    was written. Then, with that attempt's first raw frame delivered for the first time,
    nothing of the run was published: its attempt's other frames, closing ones included,
    come after that frame on the run's subject. (A run that ended otherwise may have
    closing frames of the next generation ahead of it.)"""
    return (
        state is not None
        and state.generation == FIRST_GENERATION
        and (not state.ended or state.finished)
        and not state.closed
        and state.last_seq == 0
    )


def _know(cursor: RunCursor, state: FrameState | None) -> None:
    """Record in `cursor` what Postgres says of the run's attempts."""
    cursor.known = state is not None
    if state is not None:
        cursor.secret, cursor.claimed, cursor.ended = state.secret, state.generation, state.ended
        cursor.tenant = state.tenant


def _signed(cursor: RunCursor, raw: RawFrame) -> bool:
    """Whether `raw` comes from an attempt of its run: of the run's tenant, a generation
    Postgres claimed (or the closing frames of the next one, which Postgres writes for a
    run that ended without an attempt), carrying that generation's token."""
    if not cursor.known:
        return False
    if cursor.tenant and raw.tenant != cursor.tenant:
        return False  # signed, but published as another tenant's: never theirs to see
    claimed = raw.generation <= cursor.claimed or (
        raw.generation == cursor.claimed + 1
        and cursor.ended
        and raw.type in (FrameType.ERROR, FrameType.DONE)
    )
    if not claimed:
        return False
    if (
        cursor.proved == raw.generation
        and raw.token is not None
        and cursor.proved_token is not None
        and hmac.compare_digest(raw.token, cursor.proved_token)
    ):
        return True  # the token a frame of this generation proved before (no hash again)
    if not authentic(raw.token, cursor.secret, raw.generation):
        return False
    cursor.proved, cursor.proved_token = raw.generation, raw.token
    return True


class Pipeline:
    """Consumes the raw frames partitions this relay owns, one task per partition."""

    def __init__(self, settings: RelaySettings, store: Store, broker: Broker) -> None:
        self.settings = settings
        self.store = store
        self.broker = broker
        self.cursors: dict[int, dict[str, RunCursor]] = {}
        # Retried publishes are stored at most two fetches out of order.
        self.segments = SegmentWriter(settings, store, broker, repair_margin=2 * FETCH_BATCH)
        self._owner: PartitionOwner | None = None

    async def run(self, stop: asyncio.Event) -> None:
        """Relay the partitions this relay owns until `stop`."""
        stream = self.broker.subjects.frames_in_stream
        await self.broker.ensure_streams(StreamLimits.of(self.settings))
        if await self.broker.delete_consumer(stream, LEGACY_CONSUMER):
            log.info("removed the single raw-frames consumer of an earlier version")
        owner = self._owner = PartitionOwner(
            self.settings.database_url,
            RELAY_PARTITIONS,
            self._consume,
            self._released,
            timeout_ms=self.settings.partition_timeout_ms,
        )
        flusher = asyncio.create_task(self.segments.flush_every())
        try:
            await owner.run(stop)
        finally:
            flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flusher
            await self.segments.flush()

    async def _consume(self, partition: int, stop: asyncio.Event) -> None:
        """Relay one partition, in stream order, until `stop`."""
        frames_in = DurablePull(
            self.broker,
            self.broker.subjects.frames_in_stream,
            relay_consumer(partition),
            limits=StreamLimits.of(self.settings),
            max_ack_pending=RAW_FRAMES_IN_FLIGHT,
            ack_wait_s=RAW_FRAME_ACK_WAIT_S,
            filter_subject=self.broker.subjects.frames_in_partition(partition),
            declare_streams=False,  # declared once by run()
        )
        await frames_in.open()
        cursors = self.cursors.setdefault(partition, {})
        try:
            while (msgs := await frames_in.fetch(FETCH_BATCH, stop)) is not None:
                if not await self._still_owner(stop):
                    # Given back at once, for the partition's next owner, rather than
                    # left to wait out their ack_wait: a stall of every run here.
                    await frames_in.close(unhandled=msgs)
                    break
                batch: list[Pending] = []
                parsed = [(msg, raw) for msg in msgs if (raw := await self._parse(msg)) is not None]
                await self._preload(cursors, parsed)
                for msg, raw in parsed:
                    await self._process(cursors, raw, msg, batch)
                await self._settle(cursors, batch)
        finally:
            await frames_in.close()

    async def _still_owner(self, stop: asyncio.Event) -> bool:
        """Wait until this relay's partition locks are confirmed (at once, normally);
        False when the partition is being stopped meanwhile."""
        while self._owner is not None and not self._owner.current():
            if stop.is_set():
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), OWNER_CHECK_S)
        return not stop.is_set()

    async def _released(self, partition: int) -> None:
        # Another relay may advance these runs now: forget their cursors, write segments.
        self.cursors.pop(partition, None)
        await self.segments.flush()

    async def _lookup(
        self, raws: list[RawFrame], fresh: AbstractSet[str] = frozenset()
    ) -> dict[str, RunCursor]:
        """The cursors of the runs of `raws`, rebuilt together: their last published
        frames, and their states in Postgres in one query, all at once.

        `fresh`: runs whose raw frame here is the first frame of their first attempt,
        delivered for the first time. Nothing can have been published for such a run
        yet, unless Postgres says otherwise (another attempt claimed it, it ended, or a
        segment of it was written): only then is its last published frame asked for."""
        first: dict[str, RawFrame] = {}  # each run's first frame here
        for raw in raws:
            first.setdefault(raw.run_id, raw)
        asked = [run_id for run_id in first if run_id not in fresh]
        # Every run's state: where to go on from (for a run the stream no longer holds),
        # and what tells its attempts' frames from forged ones. Asked beside the stream,
        # not after it: a new run's first frame waits for one round trip, not two.
        states, lasts = await asyncio.gather(
            self.store.frame_states(list(first)), self._last_frames(first, asked)
        )
        found = dict(zip(asked, lasts, strict=True))
        touched = [run_id for run_id in first if run_id in fresh and not _new(states.get(run_id))]
        if touched:
            found.update(zip(touched, await self._last_frames(first, touched), strict=True))
        return {run_id: _cursor_from(found.get(run_id), states.get(run_id)) for run_id in first}

    async def _last_frames(
        self, first: dict[str, RawFrame], run_ids: list[str]
    ) -> list[StoredMsg | None]:
        subjects = self.broker.subjects
        return await asyncio.gather(
            *(
                self.broker.last_on_subject(
                    subjects.run_frames_stream, subjects.run_frames(first[run_id].tenant, run_id)
                )
                for run_id in run_ids
            )
        )

    @staticmethod
    def _remember(cursors: dict[str, RunCursor], run_id: str, cursor: RunCursor) -> None:
        if not cursor.closed:  # a closed run's late frames must not grow memory
            cursors[run_id] = cursor

    async def _preload(
        self, cursors: dict[str, RunCursor], parsed: list[tuple[Msg, RawFrame]]
    ) -> None:
        """Cursors of the batch's runs that have none yet, looked up together. (On an
        error each frame looks its run up by itself, and handles the error there.)"""
        new = [raw for _, raw in parsed if raw.run_id not in cursors]
        if not new:
            return
        fresh = {
            raw.run_id
            for msg, raw in parsed
            if raw.generation == FIRST_GENERATION
            and raw.seq == 1
            and msg.metadata.num_delivered == 1
        }
        try:
            found = await self._lookup(new, fresh)
        except RunwireError:
            return
        for run_id, cursor in found.items():
            self._remember(cursors, run_id, cursor)

    async def _raw_on_subject(
        self, subject: str, before: int | None = None
    ) -> list[tuple[int, int, int]] | None:
        """The raw frames still stored on one run's subject, those ahead of stream
        sequence `before` when given (None: too many to look)."""
        stream = self.broker.subjects.frames_in_stream
        return await self.broker.raw_frames_on(stream, subject, before)

    async def _cursor(self, cursors: dict[str, RunCursor], raw: RawFrame) -> RunCursor:
        """The run's cursor, from memory or rebuilt from the last published frame."""
        cursor = cursors.get(raw.run_id)
        if cursor is None:
            cursor = (await self._lookup([raw]))[raw.run_id]
            self._remember(cursors, raw.run_id, cursor)
        return cursor

    async def _parse(self, msg: Msg) -> RawFrame | None:
        try:
            raw = RawFrame.model_validate_json(msg.data)
        except ValidationError as exc:
            log.error("malformed raw frame dropped: %s", exc)
            await msg.term()
            return None
        if NUL_ESCAPE in msg.data:
            # Postgres cannot store a NUL (an attempt replaces it, an older or faulty one
            # may not): replaced here, before the frame is published, so that what a
            # follower sees is what its segment keeps, and the segment can be written.
            log.warning(
                "a raw frame held a NUL character; relayed with U+FFFD in its place",
                extra=fields(run_id=raw.run_id, tenant=raw.tenant, seq=raw.seq),
            )
            raw = raw.model_copy(update={"data": storable(raw.data)})
        return raw

    async def _process(
        self, cursors: dict[str, RunCursor], raw: RawFrame, msg: Msg, batch: list["Pending"]
    ) -> None:
        with bind(run_id=raw.run_id, tenant=raw.tenant):
            try:
                await self._relay(cursors, raw, msg, batch)
            except RunwireError as exc:
                log.warning("frame not relayed yet: %s", exc.message)
                cursors.pop(raw.run_id, None)  # rebuild from the stream next time
                await msg.nak(delay=0.5)

    async def _relay(
        self, cursors: dict[str, RunCursor], raw: RawFrame, msg: Msg, batch: list["Pending"]
    ) -> None:
        cursor = await self._cursor(cursors, raw)
        if not _signed(cursor, raw) and raw.generation > cursor.claimed:
            # A generation claimed since the cursor was made: ask Postgres again.
            _know(cursor, (await self.store.frame_states([raw.run_id])).get(raw.run_id))
        if not _signed(cursor, raw):
            log.error(
                "raw frame refused: it is not signed by an attempt of its run (forged, or "
                "sent by a faulty service)",
                extra=fields(generation=raw.generation, seq=raw.seq, frame_type=raw.type.value),
            )
            await msg.term()
            return
        verdict = cursor.judge(raw.generation, raw.seq)
        if verdict == Verdict.KEEP and raw.generation > max(cursor.generation, FIRST_GENERATION):
            await self._settle(cursors, batch)  # what came before is acknowledged first
            # A new generation (a resumed attempt, or the closing frames of recovery) starts
            # only once every older generation's raw frame of the run has been handled,
            # including any that a crashed relay was holding: they are still in the
            # work-queue stream. (The first generation has no older frames. Its own later
            # frames stored ahead of it, when a failed publish was retried, do not count:
            # they wait for this one.)
            ahead = msg.metadata.sequence.stream
            stored = await self._raw_on_subject(msg.subject, ahead)
            if stored is None or any(g < raw.generation for _, g, _ in stored):
                await msg.nak(delay=GAP_RETRY_DELAY_S)
                return
        if verdict == Verdict.WAIT:
            if msg.metadata.num_delivered < GAP_GIVE_UP_DELIVERIES:
                await msg.nak(delay=GAP_RETRY_DELAY_S)
                return
            # Given up only when what is missing is nowhere in the stream; a frame that
            # is there (stored late, after a retried publish) will come. (Too many stored
            # to look at: given up, as always.)
            after = cursor.raw_seq if raw.generation == cursor.generation else 0
            stored = await self._raw_on_subject(msg.subject) or []
            if any(g == raw.generation and after < seq < raw.seq for _, g, seq in stored):
                await msg.nak(delay=GAP_RETRY_DELAY_S)
                return
            log.error(
                "frames %d..%d of generation %d never arrived; continuing without them",
                cursor.raw_seq + 1 if raw.generation == cursor.generation else 1,
                raw.seq - 1,
                raw.generation,
            )
            verdict = Verdict.KEEP
        if verdict == Verdict.DROP:
            await msg.ack()
            if cursor.closed and raw.type == FrameType.DONE:
                # A `done` published already comes again: a relay died before writing
                # the run's last frames (their raw frames came back here), or the sweep
                # published the closing frames a second time. Settle and write what is
                # pending first, then repair what is still missing.
                await self._settle(cursors, batch)
                await self.segments.ensure_complete(raw.tenant, raw.run_id)
            return
        is_done = raw.type == FrameType.DONE
        # Not validated again: every field comes from the raw frame, validated on arrival.
        frame = Frame.model_construct(
            run_id=raw.run_id, seq=cursor.seq + 1, type=raw.type, data=raw.data, at=raw.at
        )
        cursor.advance(raw.generation, raw.seq, is_done)
        # Published without waiting: a connection stores messages in the order they are
        # sent, so the frames of a batch are pipelined and acknowledged together.
        body = frame.model_dump_json()  # once: published, then written to a segment
        try:
            publish = await self.broker.send_client_frame(
                raw.tenant, frame, body.encode(), raw.generation, raw.seq
            )
        except RunwireError as exc:
            publish = failed_publish(exc)  # sent again by `_stored`
        batch.append(Pending(msg, raw, frame, body, publish))

    async def _settle(self, cursors: dict[str, RunCursor], batch: list["Pending"]) -> None:
        """Wait for a batch's publishes in order; buffer and ack each stored frame.

        A publish that failed is sent again with the same message id (the stream drops
        it if the first one was stored after all). If it still fails, it and every later
        frame of the batch are handed back (nak) and their runs' cursors rebuilt.
        """
        urgent = False
        failed = False
        relayed = 0
        for pending in batch:
            with bind(run_id=pending.raw.run_id, tenant=pending.raw.tenant):
                if not failed:
                    stream_seq = await self._stored(pending)
                    failed = stream_seq is None
                if failed or stream_seq is None:
                    cursors.pop(pending.raw.run_id, None)
                    await pending.msg.nak(delay=0.5)
                    continue
                is_done = pending.raw.type == FrameType.DONE
                relayed += 1
                RELAY_LAG.observe(max(0.0, (datetime.now(UTC) - pending.frame.at).total_seconds()))
                self.segments.buffer(
                    pending.frame, pending.body, pending.raw, pending.msg, stream_seq, is_done
                )
                urgent = urgent or pending.raw.type in URGENT_FRAME_TYPES
                if is_done:
                    # Keep memory flat: a closed run's cursor is rebuilt if ever needed.
                    cursors.pop(pending.raw.run_id, None)
        batch.clear()
        if relayed:
            FRAMES_RELAYED.inc(relayed)
        self.segments.flush_soon(urgent)

    async def _stored(self, pending: "Pending") -> int | None:
        for attempt in range(PUBLISH_TRIES):
            try:
                if attempt == 0:
                    return await pending.publish
                return await self.broker.publish_client_frame(
                    pending.raw.tenant,
                    pending.frame,
                    pending.body.encode(),
                    pending.raw.generation,
                    pending.raw.seq,
                )
            except RunwireError as exc:
                log.warning("frame %d not published yet: %s", pending.frame.seq, exc.message)
                await asyncio.sleep(0.2 * (attempt + 1))
        return None
