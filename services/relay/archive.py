"""The archiver: every frame the frames stream stores, written to Postgres segments.

Attempts publish each client frame once, numbered and fenced, so the stream holds each
run's frames 1..N in order, once, and nothing forged: the relay numbers, checks and
republishes nothing. It hears each frame as the stream republishes it on its run's live
subject (a plain subscription to `<prefix>.*.runs.*.live`, where only the server
publishes: no consumer, nothing acknowledged frame by frame) and buffers each run's
frames for its next segment (`segments.py`).

The stream's sequences are its frames, one after another, and each republished frame
carries its own. A frame missing between the last one heard and the next (dropped on
the way to a busy relay, or lost while the stream's leader changed) is read from the
stream before the later one, and when nothing is heard for `LIVE_IDLE_S` the relay asks
the stream whether it stored more. How far the archive is written is kept in Postgres
(`frame_archive`: every frame up to that stream sequence is in a segment, or was left
out as malformed), every `PROGRESS_S` and whenever the archive changes hands: the relay
that archives next, after a take-over or a restart, reads the stream from there on
before it listens.

One relay archives at a time: it reads only while it holds the archive's Postgres
advisory lock (`partitions.py`, with one partition), and a standby relay takes the lock
over when the active one dies (its connection ends) or freezes past
`partition_timeout_ms`.

Each run's segments stay contiguous. A frame that follows the last one this relay took
of its run is buffered, and a run's first frame heard live starts its run here. Any
other (a run this relay has not seen from its first frame: read from the stream after a
take-over or a restart, or frames missing before it) has its run brought up to date
from the stream first (`SegmentWriter.sync`), which writes what no segment holds yet. A
malformed message is logged with its run and left out. While Postgres is away the relay
tries the same frame again; what the stream stores meanwhile waits in the subscription,
or past its bounds is read from the stream once the relay goes on.
"""

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from nats.aio.msg import Msg

from runwire.contracts.frames import URGENT_FRAME_TYPES
from runwire.contracts.subjects import Subjects
from runwire.relay.partitions import ARCHIVE_LOCKS, PartitionOwner
from runwire.relay.segments import SegmentWriter
from runwire.relay.stored import MalformedFrame, StoredFrame, parse_stored
from runwire.relay.upgrade import retire_raw_frames
from runwire.runtime.broker import Broker
from runwire.runtime.errors import RunwireError, Unavailable
from runwire.runtime.logs import bind, fields
from runwire.runtime.settings import RelaySettings
from runwire.runtime.store import Store
from runwire.runtime.streams import StreamLimits

log = logging.getLogger(__name__)

# One archiver at a time: the whole stream is one partition.
ARCHIVE_PARTITIONS = 1
# Nothing heard this long: the stream is asked whether it stored more.
LIVE_IDLE_S = 1.0
# How often the archive's progress is written to Postgres.
PROGRESS_S = 1.0
# Frames read from the stream at a time (catching up, or filling a gap).
CATCH_UP_BATCH = 1000
# The pause before a frame Postgres could not take is tried again.
RETRY_S = 0.5
OWNER_CHECK_S = 0.05
# A frame whose archiving fails for a reason other than an outage (a defect) is tried
# this many times, then left out.
DEFECT_TRIES = 3
# What the live subscription holds while the relay is busy (writing, catching up); what
# comes past it is dropped (the client drops it, or the server for a client too slow)
# and the relay reads it from the stream.
LIVE_PENDING_MSGS = 100_000
LIVE_PENDING_BYTES = 256 * 1024 * 1024
# The durable consumer through which relays of earlier versions archived the stream: its
# place is where this archive starts (it is removed then).
EARLIER_CONSUMER = "relay-archive"
# Runs whose place this relay remembers; past it the oldest are forgotten (a forgotten
# run is looked up again if its frames keep coming: nothing is lost, it costs a query).
MAX_RUNS = 100_000


@dataclass
class RunCursor:
    """Where this relay stands in one run: every frame up to `last_seq` is written or
    buffered; `tenant`, whose run it is."""

    last_seq: int
    tenant: str


class Archiver:
    """Archives the frames stream into Postgres segments while this relay holds the
    archive lock."""

    def __init__(self, settings: RelaySettings, store: Store, broker: Broker) -> None:
        self.settings = settings
        self.store = store
        self.broker = broker
        self.stream = broker.subjects.run_frames_stream
        self.runs: dict[str, RunCursor] = {}
        self.segments = SegmentWriter(settings, store, broker)
        # Every frame the stream stored up to this sequence is taken (buffered, written,
        # or left out); and how far Postgres says the archive is written.
        self.through = 0
        self.saved = 0
        # When the stream archived was made (a stream made anew numbers from 1 again).
        self.created = ""
        self._owner: PartitionOwner | None = None
        self._taking = asyncio.Lock()
        self._heard_at = 0.0

    async def run(self, stop: asyncio.Event) -> None:
        """Archive while this relay holds the archive lock, until `stop`."""
        await self.broker.ensure_streams(StreamLimits.of(self.settings))
        await retire_raw_frames(self.broker)
        owner = self._owner = PartitionOwner(
            self.settings.database_url,
            ARCHIVE_PARTITIONS,
            self._consume,
            self._released,
            timeout_ms=self.settings.partition_timeout_ms,
            lock_class=ARCHIVE_LOCKS,
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
        """Archive the frames stream, in stream order, until `stop`: what it stored since
        the archive's progress first, then each frame as it is stored."""
        listening = asyncio.Event()

        async def heard(msg: Msg) -> None:
            await listening.wait()
            async with self._taking:
                await self._heard(msg, stop)

        live = await self.broker.nc.subscribe(
            self.broker.subjects.live_frames_wildcard,
            cb=heard,
            pending_msgs_limit=LIVE_PENDING_MSGS,
            pending_bytes_limit=LIVE_PENDING_BYTES,
        )
        try:
            while (start := await self._start(stop)) is None:
                if stop.is_set():
                    return
            self.through = self.saved = start
            log.info("archiving the frames stream from stream sequence %d on", self.through + 1)
            async with self._taking:
                if not await self._catch_up(stop):
                    return
            listening.set()
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), min(LIVE_IDLE_S, PROGRESS_S))
                await self._save_progress()
                if asyncio.get_running_loop().time() - self._heard_at >= LIVE_IDLE_S:
                    async with self._taking:
                        await self._look_at_the_stream(stop)
        finally:
            with contextlib.suppress(Exception):
                await live.unsubscribe()

    async def _start(self, stop: asyncio.Event) -> int | None:
        """Where the archive stands: what Postgres says, or else where the consumer of an
        earlier version stood, or else nothing archived yet. None (after a pause) while
        Postgres or the stream cannot say."""
        try:
            return await self._archive_start()
        except RunwireError as exc:
            log.warning("where the archive stands is not known yet: %s", exc.message)
            await _pause(stop, RETRY_S)
            return None

    async def _archive_start(self) -> int:
        last, created = await self.broker.stream_position(self.stream)
        kept = await self.store.archived_through(self.stream)
        self.created = created
        if kept is None:
            through = 0
            earlier = await self.broker.consumer_of(self.stream, EARLIER_CONSUMER)
            if earlier is not None and earlier.ack_floor is not None:
                through = int(earlier.ack_floor.stream_seq or 0)
            await self.store.restart_archive(self.stream, created, through)
            if earlier is not None:
                await self.broker.delete_consumer(self.stream, EARLIER_CONSUMER)
                log.info("the archive's consumer of an earlier version removed")
            return through
        kept_created, through = kept
        if kept_created != created or through > last:
            return await self._restart(created)
        return through

    async def _restart(self, created: str) -> int:
        log.warning(
            "the frames stream was made anew (at %s): it is archived from its start", created
        )
        await self.store.restart_archive(self.stream, created, 0)
        self.created = created
        self.runs.clear()
        return 0

    async def _look_at_the_stream(self, stop: asyncio.Event) -> None:
        """Nothing taken for a while: read what the stream stored meanwhile, if anything
        (a frame whose republish was lost, with none after it), and notice a stream made
        anew."""
        try:
            last, created = await self.broker.stream_position(self.stream)
            if created != self.created or last < self.through:
                self.through = self.saved = await self._restart(created)
        except RunwireError as exc:
            log.warning("the frames stream cannot be asked how far it is: %s", exc.message)
            return
        if last > self.through:
            await self._catch_up(stop, last)

    async def _heard(self, msg: Msg, stop: asyncio.Event) -> None:
        headers = msg.headers or {}
        subject = headers.get("Nats-Subject", "")
        try:
            stream_seq = int(headers["Nats-Sequence"])
        except (KeyError, ValueError):
            stream_seq = 0
        if (
            stream_seq <= 0
            or msg.reply
            or headers.get("Nats-Stream") != self.stream
            or msg.subject != Subjects.live_of(subject)
        ):
            # Not the stream's republish: a tenant's consumer may deliver anywhere, a live
            # subject too (nats-server does not check a push consumer's deliver subject).
            log.warning(
                "a message on %s that the frames stream did not store: left out", msg.subject
            )
            return
        if stream_seq <= self.through:
            return  # read from the stream already
        if stream_seq > self.through + 1 and not await self._catch_up(stop, stream_seq - 1):
            return
        if await self._take(subject, headers, msg.data, stream_seq, stop, live=True):
            # Only a frame taken counts as heard: the stream is looked at after a quiet
            # while whatever else arrives.
            self._heard_at = asyncio.get_running_loop().time()

    async def _catch_up(self, stop: asyncio.Event, upto: int | None = None) -> bool:
        """Take what the stream stored after `through`, up to `upto` (its last frame when
        None); False when stopped first."""
        subjects = self.broker.subjects.run_frames_wildcard
        while not stop.is_set():
            try:
                end = upto if upto is not None else await self.broker.last_stream_seq(self.stream)
                while self.through < end:
                    got, whole = await self.broker.read_range(
                        self.stream, subjects, self.through + 1, end, batch=CATCH_UP_BATCH
                    )
                    for m in got:
                        subject = m.headers.get("Nats-Subject", "")
                        if not await self._take(subject, m.headers, m.data, m.stream_seq, stop):
                            return False
                    if whole:
                        self.through = end  # the rest is gone from the stream (purged, expired)
                    await self._save_progress()
                return True
            except RunwireError as exc:
                log.warning(
                    "the frames stream not read from stream sequence %d yet: %s",
                    self.through + 1,
                    exc.message,
                )
                await _pause(stop, RETRY_S)
        return False

    async def _take(
        self,
        subject: str,
        headers: dict[str, str],
        data: bytes,
        stream_seq: int,
        stop: asyncio.Event,
        *,
        live: bool = False,
    ) -> bool:
        """Archive one frame the stream stored (heard `live`, or read from the stream);
        False when stopped before it was taken."""
        failures = 0
        while await self._still_owner(stop):
            try:
                stored = parse_stored(subject, headers, data, stream_seq)
            except MalformedFrame as exc:
                log.error(
                    "malformed message on the frames stream left out: %s",
                    exc.reason,
                    extra=fields(run_id=exc.run_id, tenant=exc.tenant, stream_seq=stream_seq),
                )
                self.through = stream_seq
                return True
            with bind(run_id=stored.run_id, tenant=stored.tenant):
                try:
                    urgent = await self._archive(stored, live)
                except RunwireError as exc:
                    log.warning("frame %d not archived yet: %s", stored.seq, exc.message)
                    self.runs.pop(stored.run_id, None)  # looked at again
                    await _pause(stop, RETRY_S)
                    continue
                except Exception:
                    # A defect, not an outage: the run is looked at again from Postgres and
                    # the stream (its sync), and the frame is left out after a few tries
                    # rather than hold every other run's frames up.
                    failures += 1
                    log.exception("frame %d not archived (try %d)", stored.seq, failures)
                    self.runs.pop(stored.run_id, None)
                    if failures >= DEFECT_TRIES:
                        log.error("frame %d of the run left out of its segments", stored.seq)
                        self.through = stream_seq
                        return True
                    await _pause(stop, RETRY_S)
                    continue
            self.through = stream_seq
            self.segments.flush_soon(urgent, stored.run_id)
            return True
        return False

    async def _still_owner(self, stop: asyncio.Event) -> bool:
        """Wait until this relay's archive lock is confirmed (at once, normally); False
        when the archiver is being stopped meanwhile."""
        while self._owner is not None and not self._owner.current():
            if stop.is_set():
                return False
            await _pause(stop, OWNER_CHECK_S)
        return not stop.is_set()

    async def _save_progress(self) -> None:
        """Tell Postgres how far the archive is written."""
        unwritten = self.segments.first_unwritten()
        through = self.through if unwritten is None else min(self.through, unwritten - 1)
        if through <= self.saved:
            return
        try:
            await self.store.advance_archive(self.stream, self.created, through)
        except RunwireError as exc:
            log.warning("the archive's progress not saved yet: %s", exc.message)
            return
        self.saved = through

    async def _released(self, partition: int) -> None:
        # Another relay may archive these runs now: write what is buffered, say how far
        # that goes, and forget where the runs stood.
        await self.segments.flush()
        await self._save_progress()
        self.runs.clear()
        log.info("stopped archiving the frames stream; what it held is written")

    async def _archive(self, stored: StoredFrame, live: bool) -> bool:
        """Buffer (or write) one frame; True when it must not wait for the next flush."""
        run = self.runs.get(stored.run_id)
        if run is None and stored.seq == 1 and live:
            # A run's first frame, stored after this relay began to listen: no frame of
            # it is archived yet. (The usual case: no query.)
            run = self._remember(stored.run_id, 0, stored.tenant)
        if run is not None and run.tenant != stored.tenant:
            self._refuse(stored, run.tenant)
            return False
        if run is not None and stored.seq == run.last_seq + 1:
            self.segments.buffer(stored)
            run.last_seq = stored.seq
            return stored.frame.type in URGENT_FRAME_TYPES
        if run is not None and stored.seq <= run.last_seq:
            return False  # taken already
        # A run in progress this relay has not seen from its start, or frames missing
        # before this one: Postgres and the stream say what is archived and what is not.
        # What is buffered is written first, so that the run's segments stay in order.
        await self.segments.flush()
        if self.segments.holds(stored.run_id):
            raise Unavailable("the run's earlier frames are not written yet")
        owner = await self.store.get_run_by_id(stored.run_id)
        if owner is None or owner.tenant != stored.tenant:
            self._refuse(stored, owner.tenant if owner else None)
            return False
        complete = await self.segments.sync(stored.tenant, stored.run_id, stored.stream_seq)
        self._remember(stored.run_id, max(complete, stored.seq), stored.tenant)
        return False

    def _refuse(self, stored: StoredFrame, tenant: str | None) -> None:
        """A frame of a run Postgres does not have (deleted when its retention ended), or
        stored under another tenant's subject than the run's (a faulty or hostile
        publisher): never archived into the run's segments."""
        if tenant is None:
            log.error("frame %d of a run Postgres does not have: not archived", stored.seq)
        else:
            log.error(
                "frame %d of the run was stored under tenant %s's subject; the run is %s's: "
                "not archived",
                stored.seq,
                stored.tenant,
                tenant,
            )

    def _remember(self, run_id: str, last_seq: int, tenant: str) -> RunCursor:
        run = self.runs[run_id] = RunCursor(last_seq, tenant)
        if len(self.runs) > MAX_RUNS:
            oldest = next(iter(self.runs))
            if not self.segments.holds(oldest):
                del self.runs[oldest]
        return run


async def _pause(stop: asyncio.Event, seconds: float) -> None:
    """Wait `seconds`, or less if `stop` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
