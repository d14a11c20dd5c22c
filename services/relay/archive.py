"""The archiver: every frame the frames stream stores, written to Postgres segments.

Attempts publish each client frame once, numbered and fenced, so the stream holds each
run's frames 1..N in order, once, and nothing forged: the relay numbers, checks and
republishes nothing. It reads the stream with one durable pull consumer (filtered on
every run's client subject, from the first message on) and buffers each run's frames
for its next segment (`segments.py`); a frame is acknowledged only once its segment is
written, so the frames a crashed relay held come back to the next one.

One relay archives at a time: the consumer runs only while this relay holds the
archive's Postgres advisory lock (`partitions.py`, with one partition), and a standby
relay takes the lock over when the active one dies (its connection ends) or freezes
past `partition_timeout_ms`.

Each run's segments stay contiguous. A frame that follows the last one this relay took
of its run is buffered. One this relay took already (delivered again) is acknowledged
with its segment. Any other (a run this relay has not seen from its first frame: after a
take-over, a restart, a redelivery after a crash, or frames missing before it) has its
run brought up to date from the stream first (`SegmentWriter.sync`), which writes what
no segment holds yet. A malformed message is logged with its run and terminated.
"""

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from nats.aio.msg import Msg

from runwire.contracts.frames import URGENT_FRAME_TYPES
from runwire.relay.partitions import ARCHIVE_LOCKS, PartitionOwner
from runwire.relay.segments import SegmentWriter
from runwire.relay.stored import MalformedFrame, StoredFrame, parse_stored
from runwire.relay.upgrade import retire_raw_frames
from runwire.runtime.broker import Broker
from runwire.runtime.consumer import DurablePull
from runwire.runtime.errors import RunwireError, Unavailable
from runwire.runtime.logs import bind, fields
from runwire.runtime.settings import RelaySettings
from runwire.runtime.store import Store
from runwire.runtime.streams import StreamLimits

log = logging.getLogger(__name__)

# The durable consumer of the frames stream that archives it.
ARCHIVE_CONSUMER = "relay-archive"
# One archiver at a time: the whole stream is one partition.
ARCHIVE_PARTITIONS = 1
FETCH_BATCH = 256
FRAMES_IN_FLIGHT = 10_000
# Short, so that frames a crashed relay had fetched come back quickly to the next one.
ARCHIVE_ACK_WAIT_S = 5.0
OWNER_CHECK_S = 0.05
NAK_DELAY_S = 0.5
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
        self.runs: dict[str, RunCursor] = {}
        self.segments = SegmentWriter(settings, store, broker)
        self._owner: PartitionOwner | None = None

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
        """Archive the frames stream, in stream order, until `stop`."""
        subjects = self.broker.subjects
        frames = DurablePull(
            self.broker,
            subjects.run_frames_stream,
            ARCHIVE_CONSUMER,
            limits=StreamLimits.of(self.settings),
            max_ack_pending=FRAMES_IN_FLIGHT,
            ack_wait_s=ARCHIVE_ACK_WAIT_S,
            filter_subject=subjects.run_frames_wildcard,
            declare_streams=False,  # declared once by run()
        )
        await frames.open()
        log.info("archiving the frames stream")
        try:
            while (msgs := await frames.fetch(FETCH_BATCH, stop)) is not None:
                if not await self._still_owner(stop):
                    # Given back at once, for the next archiver, rather than left to wait
                    # out their ack_wait.
                    await frames.close(unhandled=msgs)
                    break
                urgent = False
                for msg in msgs:
                    urgent = await self.handle(msg) or urgent
                self.segments.flush_soon(urgent)
        finally:
            await frames.close()

    async def _still_owner(self, stop: asyncio.Event) -> bool:
        """Wait until this relay's archive lock is confirmed (at once, normally); False
        when the archiver is being stopped meanwhile."""
        while self._owner is not None and not self._owner.current():
            if stop.is_set():
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), OWNER_CHECK_S)
        return not stop.is_set()

    async def _released(self, partition: int) -> None:
        # Another relay may archive these runs now: write what is buffered, and forget
        # where the runs stood.
        await self.segments.flush()
        self.runs.clear()
        log.info("stopped archiving the frames stream; what it held is written")

    async def handle(self, msg: Msg) -> bool:
        """Archive one message of the frames stream; True when its frame must not wait
        for the next flush."""
        try:
            stored = parse_stored(msg.subject, msg.headers, msg.data, msg.metadata.sequence.stream)
        except MalformedFrame as exc:
            log.error(
                "malformed message on the frames stream terminated: %s",
                exc.reason,
                extra=fields(
                    run_id=exc.run_id,
                    tenant=exc.tenant,
                    stream_seq=msg.metadata.sequence.stream,
                ),
            )
            await msg.term()
            return False
        with bind(run_id=stored.run_id, tenant=stored.tenant):
            try:
                return await self._archive(stored, msg)
            except RunwireError as exc:
                log.warning("frame %d not archived yet: %s", stored.seq, exc.message)
                self.runs.pop(stored.run_id, None)  # looked at again when it comes back
                await msg.nak(delay=NAK_DELAY_S)
                return False

    async def _archive(self, stored: StoredFrame, msg: Msg) -> bool:
        run = self.runs.get(stored.run_id)
        if run is None and stored.seq == 1 and msg.metadata.num_delivered == 1:
            # A run's first frame, delivered for the first time: nobody archived any
            # frame of it yet. (The usual case: no query.)
            run = self._remember(stored.run_id, 0, stored.tenant)
        if run is not None and run.tenant != stored.tenant:
            await self._refuse(stored, run.tenant, msg)
            return False
        if run is not None and stored.seq == run.last_seq + 1:
            self.segments.buffer(stored, msg)
            run.last_seq = stored.seq
            return stored.frame.type in URGENT_FRAME_TYPES
        if run is not None and stored.seq <= run.last_seq:
            await self.segments.settle_again(stored.run_id, stored.seq, msg)
            return False
        # A run in progress this relay has not seen from its start, a redelivery after a
        # crash, or frames missing before this one: Postgres and the stream say what is
        # archived and what is not. What is buffered is written first, so that the run's
        # segments stay in order.
        await self.segments.flush()
        if self.segments.holds(stored.run_id):
            raise Unavailable("the run's earlier frames are not written yet")
        owner = await self.store.get_run_by_id(stored.run_id)
        if owner is None or owner.tenant != stored.tenant:
            await self._refuse(stored, owner.tenant if owner else None, msg)
            return False
        complete = await self.segments.sync(stored.tenant, stored.run_id, stored.stream_seq)
        await msg.ack()
        self._remember(stored.run_id, max(complete, stored.seq), stored.tenant)
        return False

    async def _refuse(self, stored: StoredFrame, tenant: str | None, msg: Msg) -> None:
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
        await msg.term()

    def _remember(self, run_id: str, last_seq: int, tenant: str) -> RunCursor:
        run = self.runs[run_id] = RunCursor(last_seq, tenant)
        if len(self.runs) > MAX_RUNS:
            oldest = next(iter(self.runs))
            if not self.segments.holds(oldest):
                del self.runs[oldest]
        return run
