"""`join`: every frame after a cursor known so far, and where live frames continue.

Live frames continue after the run's newest frame in the stream when the join began,
and history is read up to it, so replay plus live misses nothing; the client
de-duplicates by `seq`. Older frames come from Postgres segments, the rest from the
stream.
"""

import asyncio
import json
from typing import Any

from pydantic import PrivateAttr

from runwire.contracts.commands import JoinCommand
from runwire.contracts.frames import Frame, FrameType
from runwire.contracts.headers import REPLAY_NEXT
from runwire.contracts.replies import JoinReply, LiveCursor, RunSummary
from runwire.runtime.broker import Broker
from runwire.runtime.commands import HeadedReply
from runwire.runtime.errors import NotFound
from runwire.runtime.settings import RelaySettings
from runwire.runtime.store import Store, parse_run_id
from runwire.runtime.stream_reads import StoredMsg, frame_position

# Segments read from Postgres for a join: at first (a short replay needs no more), and
# at most at once after that.
FIRST_SEGMENTS = 8
MAX_SEGMENTS = 10_000


def _seq(msg: StoredMsg) -> int:
    """A stored frame's seq, from the header it was published with (else its body)."""
    position = frame_position(msg.headers)
    return position.seq if position is not None else Frame.model_validate_json(msg.data).seq


class _SplicedReply(JoinReply, HeadedReply):
    """A join reply whose frames are the JSON text they were stored as, placed into the
    reply's JSON as they are: a long run's replay costs the relay a copy, not a decode,
    a validation and an encode of every frame. Clients parse it as any join reply."""

    _frames: str = PrivateAttr(default="")
    _next_after: int | None = PrivateAttr(default=None)

    @classmethod
    def of(
        cls, run: RunSummary, live: LiveCursor | None, frames: list[str], next_after: int | None
    ) -> "_SplicedReply":
        reply = cls.model_construct(run=run, replay=[], live=live)
        reply._frames = ",".join(frames)
        reply._next_after = next_after
        return reply

    def reply_headers(self) -> dict[str, str]:
        return {} if self._next_after is None else {REPLAY_NEXT: str(self._next_after)}

    def model_dump_json(self, **kwargs: Any) -> str:
        head = super().model_dump_json(exclude={"replay"}, **kwargs)
        return f'{head[:-1]},"replay":[{self._frames}]}}'


class Joiner:
    """Answers join commands from segments and the client frames stream."""

    def __init__(self, settings: RelaySettings, store: Store, broker: Broker) -> None:
        self.settings = settings
        self.store = store
        self.broker = broker

    async def join(self, tenant: str, cmd: JoinCommand) -> JoinReply:
        if parse_run_id(cmd.run_id) is None:
            raise NotFound(f"no run {cmd.run_id!r}")
        stream = self.broker.subjects.run_frames_stream
        subject = self.broker.subjects.run_frames(tenant, cmd.run_id)
        # At once: the run, its segments, and its newest frame in the stream. Every frame
        # after that one has a higher stream seq, so live frames start after it (from the
        # subject's first when it has none yet).
        run, segments, last = await asyncio.gather(
            self.store.get_run(tenant, cmd.run_id),
            self.store.segment_texts_after(cmd.run_id, cmd.after, FIRST_SEGMENTS),
            self.broker.last_on_subject(stream, subject),
        )
        if run is None:
            raise NotFound(f"no run {cmd.run_id!r}")
        live_from = last.stream_seq + 1 if last is not None else 1
        if run.frames_expired and cmd.after < run.last_seq:
            raise NotFound(
                f"the frames of run {run.run_id} after seq {cmd.after} were removed when the "
                "frame retention ended; the run's summary and result are kept"
            )

        # The reply must fit in one message, with the run summary (and its result) in it.
        summary = run.summary()
        limit = min(
            self.settings.replay_max_bytes,
            self.broker.nc.max_payload - len(summary.model_dump_json()) - 8192,
        )
        # The replay's frames as JSON text, in seq order: a segment that is kept whole is
        # spliced into the reply as Postgres returns it, never decoded and encoded again.
        # Segments are read a few at a time while the reply has room: a long run's replay
        # comes in several replies, and Postgres never sends what a reply cannot hold.
        parts: list[str] = []
        cursor = cmd.after
        size = 0
        full = False
        read_from = 1
        closed = False
        read_bytes = read_rows = 0
        batch, asked = segments, FIRST_SEGMENTS
        while True:
            stop = False
            for segment in batch:
                read_rows += 1
                read_bytes += len(segment.frames)
                if segment.first_seq > cursor + 1:
                    # A gap: frames stored but not archived yet (a relay crashed before
                    # its flush, or the archive is behind). The stream has them; read it
                    # from the end of what is contiguous.
                    stop = True
                    break
                if segment.first_seq > cursor and size + len(segment.frames) < limit:
                    # (A `done` in it closes the run's frames in Postgres: `frames_closed`.)
                    parts.append(segment.frames[1:-1])  # the items of its JSON array
                    size += len(segment.frames)
                    cursor = segment.last_seq
                elif segment.first_seq > cursor and parts:
                    # It does not fit whole: the next reply starts with it.
                    full = True
                    break
                else:
                    # The cursor, or the size limit, falls inside it: its frames one by one.
                    for body in json.loads(segment.frames):
                        if body["seq"] <= cursor:
                            continue
                        text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
                        parts.append(text)
                        size += len(text)
                        cursor = body["seq"]
                        closed = closed or body["type"] == FrameType.DONE.value
                        if size >= limit:
                            break
                read_from = segment.last_stream_seq + 1
                if size >= limit:
                    # Cut inside a segment: the stream part must not be read from its end.
                    full = True
                    break
            if stop or full or len(batch) < asked:
                break
            # As many more segments as the room left takes at the size seen so far.
            asked = min(MAX_SEGMENTS, (limit - size) * read_rows // max(read_bytes, 1) + 1)
            batch = await self.store.segment_texts_after(cmd.run_id, cursor, asked)

        if last is not None and not full:
            position = frame_position(last.headers)
            closed = closed or (position is not None and position.type == FrameType.DONE.value)
            if last.stream_seq >= read_from:
                stored = await self.broker.read_subject(stream, subject, read_from, last.stream_seq)
                # By seq, each once: relays of earlier versions, which published the
                # frames, may have stored a retried publish after a later frame.
                found = {_seq(m): m for m in stored}
                for seq in sorted(s for s in found if s > cursor):
                    text = found[seq].data.decode()
                    parts.append(text)
                    cursor = seq
                    size += len(text)
                    if size >= limit:
                        full = True
                        break
        closed = closed or run.frames_closed
        # No live part when the run's frames are complete, or when the replay was cut at
        # the size limit: the client joins again from its new cursor.
        live = (
            None
            if closed or full
            else LiveCursor(stream=stream, subject=subject, stream_seq=live_from)
        )
        # A cut reply names the cursor of the rest in a header: the client asks for it
        # while it reads this one.
        return _SplicedReply.of(summary, live, parts, next_after=cursor if full else None)
