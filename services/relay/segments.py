"""Segments: the frames a relay published, written to Postgres in batches.

The frames of every run a relay publishes are buffered per run and written in one
multi-row statement per flush: every `segment_flush_ms`, when a buffer passes
`segment_bytes`, and at once for `run`, tool, `error` and `done` frames. A raw frame is
acknowledged only once its segment is written. A run whose `done` shows frames missing
from its segments (a flush lost to a crash) is repaired from the run frames stream.
"""

import asyncio
import bisect
import contextlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from nats.aio.msg import Msg

from runwire.contracts.frames import Frame, RawFrame
from runwire.contracts.headers import TRACEPARENT
from runwire.runtime import faults, tracing
from runwire.runtime.broker import Broker
from runwire.runtime.errors import RunwireError, StoreRefused
from runwire.runtime.logs import bind
from runwire.runtime.settings import RelaySettings
from runwire.runtime.store import Segment, SegmentCount, Store
from runwire.runtime.stream_reads import StoredMsg

log = logging.getLogger(__name__)

# Looks at a run whose repair met another relay's write of some of the same frames.
REPAIR_PASSES = 3


@dataclass
class SegmentBuffer:
    run_id: str
    first_seq: int
    tenant: str = ""
    generation: int = 0
    # The span that sent the frames (the attempt's), parent of the flush's span.
    traceparent: str | None = None
    last_seq: int = 0
    frames: list[str] = field(default_factory=list)
    size: int = 0
    last_stream_seq: int = 0
    closed: bool = False
    # The raw frames of these frames, acknowledged once the segment is written.
    acks: list[Msg] = field(default_factory=list)


def _flush_spans(buffers: Iterable[SegmentBuffer], started_ns: int, error: str = "") -> None:
    """A "relay flush" span in each run's trace, for the one write that saved its frames."""
    ended_ns = time.time_ns()
    for b in buffers:
        current = tracing.tracer.start_span(
            "relay flush",
            tracing.context_of(b.traceparent),
            attributes={
                **tracing.run_attributes(b.run_id, b.tenant, generation=b.generation),
                "frames": len(b.frames),
                "first_seq": b.first_seq,
                "last_seq": b.last_seq,
            },
            start_time=started_ns,
        )
        if error:
            tracing.failed(current, error)
        current.end(end_time=ended_ns)


def _segment(b: SegmentBuffer) -> Segment:
    return Segment(
        run_id=b.run_id,
        first_seq=b.first_seq,
        last_seq=b.last_seq,
        last_stream_seq=b.last_stream_seq,
        frames=b.frames,
        closed=b.closed,
    )


class _Covered:
    """Whether a seq is in one of a run's segments, from their (first, last) ranges."""

    def __init__(self, ranges: list[tuple[int, int]]) -> None:
        merged: list[list[int]] = []
        for first, last in sorted(ranges):
            if merged and first <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], last)
            else:
                merged.append([first, last])
        self._firsts = [first for first, _ in merged]
        self._lasts = [last for _, last in merged]

    def __call__(self, seq: int) -> bool:
        i = bisect.bisect_right(self._firsts, seq) - 1
        return i >= 0 and seq <= self._lasts[i]


class SegmentWriter:
    """The segments a relay has yet to write, and their writing and repair."""

    def __init__(
        self, settings: RelaySettings, store: Store, broker: Broker, *, repair_margin: int
    ) -> None:
        self.settings = settings
        self.store = store
        self.broker = broker
        # Stream messages read before the end of a run's gap-free segments when
        # repairing: retried publishes are stored at most that far out of order.
        self.repair_margin = repair_margin
        self.buffers: dict[str, SegmentBuffer] = {}
        self._flush_lock = asyncio.Lock()
        self._flush_now = asyncio.Event()

    def buffer(
        self, frame: Frame, body: str, raw: RawFrame, msg: Msg, stream_seq: int, closed: bool
    ) -> None:
        """Keep a published frame for its run's next segment; `msg`, its raw frame, is
        acknowledged once the segment is written."""
        buffer = self.buffers.get(frame.run_id)
        if buffer is None:
            buffer = self.buffers[frame.run_id] = SegmentBuffer(frame.run_id, frame.seq, raw.tenant)
        if buffer.traceparent is None or buffer.generation != raw.generation:
            buffer.generation = raw.generation
            buffer.traceparent = (msg.headers or {}).get(TRACEPARENT)
        buffer.frames.append(body)
        buffer.acks.append(msg)
        buffer.last_seq = frame.seq
        buffer.size += len(body)
        buffer.last_stream_seq = stream_seq
        buffer.closed = buffer.closed or closed

    def flush_soon(self, urgent: bool) -> None:
        """Have the flusher write at once when a frame must not wait or a buffer is full
        (the partition goes on meanwhile: a write inline held every partition up behind
        Postgres, at each run's first and last frame)."""
        if urgent or any(b.size >= self.settings.segment_bytes for b in self.buffers.values()):
            self._flush_now.set()

    async def flush(self) -> None:
        """Write every buffered segment in one statement; keep them while Postgres is
        away. A statement whose data Postgres refuses is written again run by run, so that
        one run's segment it cannot take stops no other run's (see `_write_each`)."""
        async with self._flush_lock:
            if not self.buffers:
                return
            pending = self.buffers
            self.buffers = {}
            if any(b.closed for b in pending.values()):
                await faults.point(faults.RELAY_UNWRITTEN)
            started = time.time_ns()
            try:
                counts = await self.store.insert_segments([_segment(b) for b in pending.values()])
            except StoreRefused as exc:
                log.warning(
                    "segments of %d runs refused together (%s); writing each run's alone",
                    len(pending),
                    exc.message,
                )
                counts = await self._write_each(pending.values(), started)
            except RunwireError as exc:
                _flush_spans(pending.values(), started, exc.message)
                log.warning("segments not written yet (%d runs): %s", len(pending), exc.message)
                self._keep(pending.values())
                return
            else:
                _flush_spans(pending.values(), started)
                for b in pending.values():
                    for msg in b.acks:
                        await msg.ack()
            for count in counts:
                if count.closed and count.frame_count < count.last_seq:
                    try:
                        await self.repair(count)
                    except RunwireError as exc:
                        # The run's frames are still in the stream; the next `done` this
                        # relay drops for the run (a redelivery) tries again.
                        log.warning("segments of run %s not repaired: %s", count.run_id, exc)

    async def _write_each(
        self, buffers: Iterable[SegmentBuffer], started: int
    ) -> list[SegmentCount]:
        """Write each run's segment in a statement of its own. One Postgres refuses even
        alone (text it cannot store, from a relay of an earlier version) is left out: its
        frames were published, and stay readable from the stream until they expire there;
        their raw frames are acknowledged, so that they do not come back, and the loss is
        logged with the run. One not written for another reason (Postgres away, a
        deadlock) is kept for the next flush."""
        counts: list[SegmentCount] = []
        kept: list[SegmentBuffer] = []
        for b in buffers:
            with bind(run_id=b.run_id, tenant=b.tenant):
                try:
                    counts.extend(await self.store.insert_segments([_segment(b)]))
                except StoreRefused as exc:
                    _flush_spans([b], started, exc.message)
                    log.error(
                        "frames %d..%d of the run cannot be written to Postgres (%s); left "
                        "out of its segments: a join reads them from the stream until the "
                        "run's frames expire there",
                        b.first_seq,
                        b.last_seq,
                        exc.message,
                    )
                except RunwireError as exc:
                    _flush_spans([b], started, exc.message)
                    kept.append(b)
                    continue
                else:
                    _flush_spans([b], started)
                for msg in b.acks:
                    await msg.ack()
        self._keep(kept)
        return counts

    def _keep(self, buffers: Iterable[SegmentBuffer]) -> None:
        """Buffer again segments that were not written, ahead of what came meanwhile."""
        for old in buffers:
            newer = self.buffers.get(old.run_id)
            if newer is not None:
                old.frames.extend(newer.frames)
                old.last_seq = newer.last_seq
                old.size += newer.size
                old.last_stream_seq = newer.last_stream_seq
                old.closed = old.closed or newer.closed
                old.acks.extend(newer.acks)
            self.buffers[old.run_id] = old

    async def ensure_complete(self, tenant: str, run_id: str) -> None:
        """Write what is buffered, then repair the run's segments from the stream if
        frames are still missing."""
        run = await self.store.get_run_by_id(run_id)
        if run is None or run.frames_closed:
            return
        await self.flush()
        run = await self.store.get_run_by_id(run_id)
        if run is None or run.frames_closed:
            return  # what was buffered completed it
        await self.repair(SegmentCount(run_id, tenant, run.last_seq, run.frame_count, True))
        run = await self.store.get_run_by_id(run_id)
        if run is not None and not run.frames_closed:
            log.error("frames of the run are missing from Postgres and from the stream")
            await self.store.mark_frames_closed(run_id)

    async def repair(self, count: SegmentCount) -> None:
        """Copy frames that never reached a segment (a flush lost to a crash or a failed
        write) from the stream, so the run stays replayable after the stream drops it.

        A relay that lost the partition may write some of the same frames meanwhile (it
        flushes what it held when it wakes from a freeze): a repaired segment that
        overlaps one is left out whole, so the run is looked at again, and what is
        still missing repaired, until nothing is."""
        for _ in range(REPAIR_PASSES):
            if not await self._repair_once(count):
                return  # the stream no longer has them
            run = await self.store.get_run_by_id(count.run_id)
            if run is None or run.frames_closed:
                return
            if run.frame_count >= run.last_seq:
                # Every frame is stored now, the last of them by the other relay's flush,
                # which did not hold `done` (segments never overlap: a count that reaches
                # the last seq has every frame up to it, and `done` was written).
                await self.store.mark_frames_closed(count.run_id)
                return

    async def _repair_once(self, count: SegmentCount) -> bool:
        """One pass of `_repair`; False when the stream no longer holds what is missing.
        Only the stream after the last segment that has no gap before it is read, and
        segments are looked at by their ranges: a long run costs what is missing, not
        the whole run, in memory."""
        with bind(run_id=count.run_id, tenant=count.tenant):
            stream = self.broker.subjects.run_frames_stream
            subject = self.broker.subjects.run_frames(count.tenant, count.run_id)
            ranges = await self.store.segment_ranges(count.run_id)
            covered = _Covered([(first, last) for first, last, _ in ranges])
            read_from, expected = 1, 1
            for first, last_seq, last_stream_seq in ranges:
                if first > expected:
                    break  # the first gap: what is missing comes after this point
                expected = max(expected, last_seq + 1)
                read_from = max(read_from, last_stream_seq + 1)
            # A publish the relay retried is stored after later frames, so a frame past
            # the gap may sit a little before that point in the stream: read a margin.
            read_from = max(1, read_from - self.repair_margin)
            last = await self.broker.last_on_subject(stream, subject)
            if last is None or last.stream_seq < read_from:
                log.error("frames missing from segments and gone from the stream")
                return False
            stored = await self.broker.read_subject(stream, subject, read_from, last.stream_seq)
            # In seq order, each once (a retried publish may have been stored late).
            by_seq: dict[int, StoredMsg] = {}
            for m in stored:
                seq = Frame.model_validate_json(m.data).seq
                if not covered(seq):
                    by_seq[seq] = m
            segments: list[Segment] = []
            run_of: list[str] = []
            first_seq = last_seq = last_stream = 0
            for seq in sorted(by_seq):
                m = by_seq[seq]
                if run_of and seq != last_seq + 1:
                    segments.append(
                        Segment(count.run_id, first_seq, last_seq, last_stream, run_of, True)
                    )
                    run_of = []
                if not run_of:
                    first_seq = seq
                run_of.append(m.data.decode())
                last_seq, last_stream = seq, m.stream_seq
            if run_of:
                segments.append(
                    Segment(count.run_id, first_seq, last_seq, last_stream, run_of, True)
                )
            await self.store.insert_segments(segments)
            log.warning("repaired %d frames missing from the run's segments", len(by_seq))
            return True

    async def flush_every(self) -> None:
        """Write the buffered segments every `segment_flush_ms`, and at once when a frame
        that must not wait (`run`, tool, `error`, `done`) or a full buffer asks for it:
        what arrives while a write is under way goes in the next one."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._flush_now.wait(), self.settings.segment_flush_ms / 1000
                )
            self._flush_now.clear()
            try:
                await self.flush()
            except Exception:
                # Keep flushing: buffered frames are retried, and the stream still has them.
                log.exception("segment flush failed")
