"""Segments: the stored frames of each run, written to Postgres in batches.

The frames a relay archives are buffered per run, each buffer one contiguous range of
the run's `seq`, and written in one multi-row statement per flush. A buffer is due
`segment_flush_ms` after its first frame, when it passes `segment_bytes`, and at once
when it takes a frame of `URGENT_FRAME_TYPES` (tools, effects, nodes, waits, `error`,
`done`; not an attempt's `run` frame, which its first output follows within the flush
interval anyway). A flush writes the buffers that are due and leaves the others to fill:
a short run's frames are one segment and one statement, however many other runs end
meanwhile (at hundreds of runs a second, writing every buffer at each run's `done` cut
most runs in two). `first_unwritten` says where the archive stands: every frame stored
before it is written.

`write_segments` leaves out a segment that overlaps one already written, whole (another
relay, or a relay reading again what it wrote before a crash, wrote some of the same
frames): a run whose segment was left out, or whose `done` was written with frames
missing, is brought up to date from the stream (`sync`), which holds every frame of the
run, in order, once.
"""

import asyncio
import bisect
import contextlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from runwire.relay.stored import MalformedFrame, StoredFrame, parse_stored
from runwire.runtime import faults, tracing
from runwire.runtime.broker import Broker
from runwire.runtime.errors import RunwireError, StoreRefused
from runwire.runtime.logs import bind
from runwire.runtime.metrics import FRAMES_RELAYED, RELAY_LAG
from runwire.runtime.settings import RelaySettings
from runwire.runtime.store import Segment, SegmentCount, Store

log = logging.getLogger(__name__)

# Looks at a run whose sync met another relay's write of some of the same frames.
SYNC_PASSES = 3
# The shortest wait of the flusher between two flushes of buffers that ripen.
MIN_WAIT_S = 0.001


@dataclass
class SegmentBuffer:
    """Frames first_seq..last_seq of one run, in order, not written yet."""

    run_id: str
    first_seq: int
    tenant: str = ""
    generation: int = 0
    # The span that sent the frames (the attempt's), parent of the flush's span.
    traceparent: str | None = None
    last_seq: int = 0
    frames: list[str] = field(default_factory=list)
    size: int = 0
    first_stream_seq: int = 0
    last_stream_seq: int = 0
    closed: bool = False
    # When each frame was made (its `at`), for the lag measured once it is written.
    made: list[datetime] = field(default_factory=list)
    # When its first frame was buffered (monotonic), and whether it is to be written at
    # the next flush whatever its age (an urgent frame, a full buffer, a failed write).
    since: float = field(default_factory=time.monotonic)
    due: bool = False

    def ripe(self, now: float, age_s: float) -> bool:
        """Whether the next flush writes it."""
        return self.due or now - self.since >= age_s


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


def _archived(buffers: Iterable[SegmentBuffer]) -> None:
    """Count the frames of written segments, and their lag from when they were made."""
    now = datetime.now(UTC)
    written = 0
    for b in buffers:
        written += len(b.frames)
        for made in b.made:
            RELAY_LAG.observe(max(0.0, (now - made).total_seconds()))
    if written:
        FRAMES_RELAYED.inc(written)


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


def _contiguous(run_id: str, frames: list[StoredFrame]) -> list[Segment]:
    """`frames` (in seq order) as segments, one per unbroken range of seqs."""
    segments: list[Segment] = []
    group: list[StoredFrame] = []
    for f in [*frames, None]:
        if group and (f is None or f.seq != group[-1].seq + 1):
            segments.append(
                Segment(
                    run_id,
                    group[0].seq,
                    group[-1].seq,
                    group[-1].stream_seq,
                    [g.body for g in group],
                    any(g.is_done for g in group),
                )
            )
            group = []
        if f is not None:
            group.append(f)
    return segments


class SegmentWriter:
    """The segments a relay has yet to write; their writing; a run's sync from the
    stream."""

    def __init__(self, settings: RelaySettings, store: Store, broker: Broker) -> None:
        self.settings = settings
        self.store = store
        self.broker = broker
        self.buffers: dict[str, SegmentBuffer] = {}
        # The buffers of the flush under way, by run.
        self._writing: dict[str, SegmentBuffer] = {}
        self._flush_lock = asyncio.Lock()
        self._flush_now = asyncio.Event()

    def buffer(self, stored: StoredFrame) -> None:
        """Keep a frame for its run's next segment. The frame must follow the run's
        buffered ones."""
        buffer = self.buffers.get(stored.run_id)
        if buffer is None:
            buffer = self.buffers[stored.run_id] = SegmentBuffer(
                stored.run_id, stored.seq, stored.tenant, first_stream_seq=stored.stream_seq
            )
        elif stored.seq != buffer.last_seq + 1:
            raise ValueError(f"frame {stored.seq} does not follow {buffer.last_seq}")
        generation = stored.position.generation
        if buffer.traceparent is None or buffer.generation != generation:
            buffer.generation = generation
            buffer.traceparent = stored.traceparent
        buffer.frames.append(stored.body)
        buffer.made.append(stored.frame.at)
        buffer.last_seq = stored.seq
        buffer.size += len(stored.body)
        buffer.last_stream_seq = stored.stream_seq
        buffer.closed = buffer.closed or stored.is_done

    def holds(self, run_id: str) -> bool:
        """Whether frames of the run wait to be written."""
        return run_id in self.buffers or run_id in self._writing

    def first_unwritten(self) -> int | None:
        """The stream sequence of the first frame buffered and not written yet; None when
        every frame buffered is written."""
        waiting = [*self.buffers.values(), *self._writing.values()]
        return min((b.first_stream_seq for b in waiting), default=None)

    def flush_soon(self, urgent: bool, run_id: str) -> None:
        """Have the flusher write the buffer of the run (`run_id`) at once when a frame
        must not wait or the buffer is full (the archiver goes on meanwhile)."""
        buffer = self.buffers.get(run_id)
        if buffer is None:
            return
        if urgent or buffer.size >= self.settings.segment_bytes:
            buffer.due = True
            self._flush_now.set()

    async def flush(self, *, ripe_only: bool = False) -> None:
        """Write every buffered segment (`ripe_only`: those due, see the module) in one
        statement; keep them while Postgres is away. A statement whose data Postgres
        refuses is written again run by run, so that one run's segment it cannot take
        stops no other run's (see `_write_each`)."""
        async with self._flush_lock:
            if ripe_only:
                now, age_s = time.monotonic(), self.settings.segment_flush_ms / 1000
                pending = {k: b for k, b in self.buffers.items() if b.ripe(now, age_s)}
                left = {k: b for k, b in self.buffers.items() if k not in pending}
            else:
                pending, left = self.buffers, {}
            if not pending:
                return
            self._writing = pending
            self.buffers = left
            try:
                await self._write(pending)
            except BaseException:
                # Kept whole, those already written too (writing them again writes
                # nothing twice): the archive counts a frame done only once it is
                # written, and this relay takes every one of them for buffered or written.
                self._keep(pending.values())
                raise
            finally:
                self._writing = {}

    async def _write(self, pending: dict[str, SegmentBuffer]) -> None:
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
            await self._write_each(pending.values(), started)
            return
        except RunwireError as exc:
            _flush_spans(pending.values(), started, exc.message)
            log.warning("segments not written yet (%d runs): %s", len(pending), exc.message)
            self._keep(pending.values())
            return
        _flush_spans(pending.values(), started)
        await self._settle(pending.values(), counts)

    async def _settle(self, written: Iterable[SegmentBuffer], counts: list[SegmentCount]) -> None:
        """Count the frames of written segments. A segment that `write_segments`
        left out (it overlaps one written already), or a `done` written with frames
        missing, has its run synced from the stream first; one whose sync fails is kept
        for the next flush."""
        by_run = {count.run_id: count for count in counts}
        done: list[SegmentBuffer] = []
        kept: list[SegmentBuffer] = []
        for b in written:
            count = by_run.get(b.run_id)
            if count is None or (count.closed and count.frame_count < count.last_seq):
                with bind(run_id=b.run_id, tenant=b.tenant):
                    try:
                        await self.sync(b.tenant, b.run_id, b.last_stream_seq)
                    except RunwireError as exc:
                        log.warning("segments of the run not synced yet: %s", exc.message)
                        kept.append(b)
                        continue
            done.append(b)
        _archived(done)
        self._keep(kept)

    async def _write_each(self, buffers: Iterable[SegmentBuffer], started: int) -> None:
        """Write each run's segment in a statement of its own. One Postgres refuses even
        alone is left out: its frames stay readable from the stream until they expire
        there, and the loss is logged with the run. One not written for another reason
        (Postgres away, a deadlock) is kept for the next flush."""
        kept: list[SegmentBuffer] = []
        for b in buffers:
            with bind(run_id=b.run_id, tenant=b.tenant):
                try:
                    counts = await self.store.insert_segments([_segment(b)])
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
                    continue
                except RunwireError as exc:
                    _flush_spans([b], started, exc.message)
                    kept.append(b)
                    continue
                _flush_spans([b], started)
                await self._settle([b], counts)
        self._keep(kept)

    def _keep(self, buffers: Iterable[SegmentBuffer]) -> None:
        """Buffer again segments that were not written, ahead of what came meanwhile (a
        run's newer frames follow its older ones: a run whose frames wait is synced,
        never buffered past a gap)."""
        for old in buffers:
            newer = self.buffers.get(old.run_id)
            if newer is old:
                continue  # kept already (a write that failed, then its flush)
            if newer is not None:
                old.frames.extend(newer.frames)
                old.made.extend(newer.made)
                old.last_seq = newer.last_seq
                old.size += newer.size
                old.last_stream_seq = newer.last_stream_seq
                old.closed = old.closed or newer.closed
            old.due = True  # tried once: the next flush tries again
            self.buffers[old.run_id] = old

    async def sync(self, tenant: str, run_id: str, upto: int) -> int:
        """Write to Postgres every frame of the run that the stream stored at stream
        sequence `upto` or before and no segment holds yet; returns the last seq up to
        which the run's segments are then complete (or the frames missing are gone from
        the stream as well, which is logged).

        The stream holds a run's frames in seq order, each once, so what is missing is
        read from the end of the run's gap-free segments on. Another relay may write some
        of the same frames meanwhile (one that lost the archive lock flushes what it held
        when it wakes from a freeze): a segment of ours that overlaps one of its is left
        out whole, so the run is looked at again, until nothing is missing. A run whose
        `done` is written has its frames closed, complete or not."""
        stream = self.broker.subjects.run_frames_stream
        subject = self.broker.subjects.run_frames(tenant, run_id)
        complete = 0
        closing = warned = False
        for _ in range(SYNC_PASSES):
            ranges = await self.store.segment_ranges(run_id)
            covered = _Covered([(first, last) for first, last, _ in ranges])
            read_from, complete = 1, 0
            for first, last_seq, last_stream_seq in ranges:
                if first > complete + 1:
                    break  # the first gap: what is missing comes after this point
                complete = max(complete, last_seq)
                read_from = max(read_from, last_stream_seq + 1)
            stored = await self._read(stream, subject, read_from, upto)
            closing = closing or any(f.is_done for f in stored)
            if not warned and stored and stored[0].seq > complete + 1:
                warned = True
                log.error(
                    "frames %d..%d of the run are missing from Postgres and gone from the "
                    "stream; archived without them",
                    complete + 1,
                    stored[0].seq - 1,
                )
            if stored:
                complete = max(complete, stored[-1].seq)
            missing = [f for f in stored if not covered(f.seq)]
            if not missing:
                break
            await self.store.insert_segments(_contiguous(run_id, missing))
            log.warning("archived %d frames of the run from the stream", len(missing))
        if closing:
            run = await self.store.get_run_by_id(run_id)
            if run is not None and not run.frames_closed:
                await self.store.mark_frames_closed(run_id)
        return complete

    async def _read(self, stream: str, subject: str, start: int, upto: int) -> list[StoredFrame]:
        """The run's frames stored at stream sequences start..upto, in seq order, each
        once (a malformed message is left out: the consumer terminates it)."""
        if start > upto:
            return []
        last = await self.broker.last_on_subject(stream, subject)
        if last is None or last.stream_seq < start:
            return []
        found: dict[int, StoredFrame] = {}
        for m in await self.broker.read_subject(stream, subject, start, min(upto, last.stream_seq)):
            with contextlib.suppress(MalformedFrame):
                stored = parse_stored(subject, m.headers, m.data, m.stream_seq)
                found.setdefault(stored.seq, stored)
        return [found[seq] for seq in sorted(found)]

    async def flush_every(self) -> None:
        """Write each buffered segment `segment_flush_ms` after its first frame, and at
        once when a frame that must not wait (tool, effect, node, wait, `error`, `done`)
        or a full buffer asks for it: what arrives while a write is under way goes in the
        next one."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._flush_now.wait(), self._next_flush_in())
            self._flush_now.clear()
            try:
                await self.flush(ripe_only=True)
            except Exception:
                # Keep flushing: buffered frames are retried, and the stream still has them.
                log.exception("segment flush failed")

    def _next_flush_in(self) -> float:
        """Seconds until a buffer waiting for its age ripens (a failed write's buffers,
        due already, are tried again with the next, or after `segment_flush_ms`)."""
        age_s = self.settings.segment_flush_ms / 1000
        now = time.monotonic()
        waits = [b.since + age_s - now for b in self.buffers.values() if not b.due]
        return min((max(w, MIN_WAIT_S) for w in waits), default=age_s)
