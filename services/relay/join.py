"""`join`: every frame after a cursor known so far, and where live frames continue.

Live frames continue after the run's newest frame in the stream when the join began,
and history is read up to it, so replay plus live misses nothing; the client
de-duplicates by `seq`. Older frames come from Postgres segments, the rest from the
stream.
"""

import asyncio
import json

from pydantic import TypeAdapter

from runwire.contracts.commands import JoinCommand
from runwire.contracts.frames import CHECKED, Frame, FrameType
from runwire.contracts.replies import JoinReply, LiveCursor
from runwire.runtime.broker import HDR_FRAME_TYPE, Broker, StoredMsg
from runwire.runtime.errors import NotFound
from runwire.runtime.settings import RelaySettings
from runwire.runtime.store import Store, parse_run_id

_FRAMES = TypeAdapter(list[Frame])


def _frame(msg: StoredMsg) -> Frame:
    return Frame.model_validate_json(msg.data)


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
            self.store.segments_after(cmd.run_id, cmd.after),
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
        summary = len(run.summary().model_dump_json())
        limit = min(self.settings.replay_max_bytes, self.broker.nc.max_payload - summary - 8192)
        replay: list[Frame] = []
        cursor = cmd.after
        size = 0
        full = False
        read_from = 1
        closed = False
        for segment in segments:
            if segment.first_seq > cursor + 1:
                # A gap: frames a relay published but never wrote (it crashed before its
                # flush). The stream has them; read it from the end of what is contiguous.
                break
            bodies = [body for body in segment.frames if body["seq"] > cursor]
            if size + segment.size >= limit:
                # The segment may not fit whole: measure frame by frame up to the limit.
                kept = []
                for body in bodies:
                    kept.append(body)
                    size += len(json.dumps(body))
                    if size >= limit:
                        break
                bodies = kept
            else:
                size += segment.size
            # One call for the segment; the frames' data was checked when they were made.
            kept_frames = _FRAMES.validate_python(bodies, context={CHECKED: True})
            replay.extend(kept_frames)
            if kept_frames:
                cursor = kept_frames[-1].seq
                closed = closed or kept_frames[-1].type == FrameType.DONE
            read_from = segment.last_stream_seq + 1
            if size >= limit:
                # Cut inside a segment: the stream part must not be read from its end.
                full = True
                break

        if last is not None and not full:
            closed = closed or last.headers.get(HDR_FRAME_TYPE) == FrameType.DONE.value
            if last.stream_seq >= read_from:
                stored = await self.broker.read_subject(stream, subject, read_from, last.stream_seq)
                # By seq, each once: a publish the relay retried may have been stored
                # after a later frame.
                frames = {f.seq: f for f in map(_frame, stored) if f.seq > cursor}
                for seq in sorted(frames):
                    replay.append(frames[seq])
                    cursor = seq
                    size += len(frames[seq].model_dump_json())
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
        return JoinReply(run=run.summary(), replay=replay, live=live)
