"""A run's frames in the frames stream: each one numbered after the last one stored.

Every frame of a run is published once, straight to the frames stream, numbered after
the run's last stored frame and fenced by it (`Nats-Expected-Last-Subject-Sequence`):
the stream stores it only if no other frame was stored on the run's subject since. So
each run's frames are contiguous from seq 1, each stored once, and an attempt fenced
out (a newer attempt, or a service closing the run, stored a frame since) is refused by
the stream itself. A frame's position header says which attempt published it
(generation) and where in that attempt's frames (raw seq), which is how a publisher
that was refused tells "mine, stored by a try whose acknowledgement was lost" from
"someone else's".

Two kinds of publishers use it: an attempt (`runwire.executor.frames`), whose frames
follow one another, and the outbox, which publishes the frames Postgres writes (an
attempt's closing `error` and `done`, a workflow's `node` frames) after the frames they
follow: `append` places such a frame, or says why it is not needed any more.
"""

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from runwire.contracts.frames import Frame, FrameType
from runwire.runtime.broker import HDR_MSG_ID, Broker, ChainMoved, frame_msg_id
from runwire.runtime.errors import Unavailable
from runwire.runtime.stream_reads import frame_position

log = logging.getLogger(__name__)

# How many times a frame is placed again after others were stored before it.
APPEND_TRIES = 8
# The frames that close an attempt (or a run).
CLOSING = (FrameType.ERROR.value, FrameType.DONE.value)


@dataclass(frozen=True, slots=True)
class Tail:
    """The run's last stored frame: its stream sequence (0: the stream holds none of the
    run's frames) and seq, and the attempt (generation, raw seq) and type it had."""

    stream_seq: int = 0
    seq: int = 0
    generation: int = 0
    raw_seq: int = 0
    type: str = ""
    msg_id: str = ""


async def read_tail(broker: Broker, tenant: str, run_id: str, archived_seq: int = 0) -> Tail:
    """The run's last frame in the stream; when the stream holds none (none published yet,
    or they aged out after being archived), `archived_seq`: the run's last archived seq."""
    s = broker.subjects
    last = await broker.last_on_subject(s.run_frames_stream, s.run_frames(tenant, run_id))
    if last is None:
        return Tail(seq=archived_seq)
    position = frame_position(last.headers)
    if position is None:  # not published by runwire: go on after it all the same
        return Tail(stream_seq=last.stream_seq, seq=Frame.model_validate_json(last.data).seq)
    return Tail(
        last.stream_seq,
        position.seq,
        position.generation,
        position.raw_seq,
        position.type,
        last.headers.get(HDR_MSG_ID, ""),
    )


class Placed(StrEnum):
    """What became of a frame the outbox publishes."""

    STORED = "stored"
    # Stored before (a try whose acknowledgement was lost, or another publisher's).
    ALREADY = "already"
    # Not needed any more: the run's frames are closed, or a newer attempt's came first.
    SUPERSEDED = "superseded"


def _verdict(tail: Tail, generation: int, raw_seq: int, type: str, msg_id: str) -> Placed | None:
    """Whether a frame Postgres wrote (attempt `generation`, the `raw_seq`-th of it) is to
    be published after `tail` (None), or is not needed."""
    if tail.msg_id == msg_id:
        return Placed.ALREADY
    if tail.type == FrameType.DONE.value or tail.generation > generation:
        return Placed.SUPERSEDED
    if type in CLOSING:
        # An attempt's closing frames go after whatever of it is stored: frames it gave
        # up on may have been stored after all, or never be.
        return None
    if tail.generation == generation and tail.raw_seq >= raw_seq:
        return Placed.ALREADY
    before = tail.raw_seq if tail.generation == generation else (raw_seq - 1 if tail.seq else 0)
    if before < raw_seq - 1:
        # A workflow's frame before it is not stored yet (two outbox publishers at once):
        # tried again later, never placed ahead of it.
        raise Unavailable(f"frame {raw_seq} of attempt {generation} waits for the one before")
    return None


async def append(
    broker: Broker,
    raw: dict[str, Any],
    archived: Callable[[str], Awaitable[tuple[int, bool]]],
    *,
    traceparent: str | None = None,
) -> Placed:
    """Publish a frame Postgres wrote (`raw`: the outbox row's body, with its run, tenant,
    generation, raw seq, type, data and time) after the run's last stored frame.
    `archived` gives a run's last archived seq and whether its frames are closed (asked
    only when the stream holds none of its frames)."""
    run_id, tenant = str(raw["run_id"]), str(raw["tenant"])
    generation, raw_seq = int(raw["generation"]), int(raw["seq"])
    at = datetime.fromisoformat(str(raw["at"]))
    msg_id = frame_msg_id(run_id, generation, raw_seq)
    for _ in range(APPEND_TRIES):
        tail = await read_tail(broker, tenant, run_id)
        if tail.stream_seq == 0:
            last_seq, closed = await archived(run_id)
            if closed:
                return Placed.SUPERSEDED
            tail = Tail(seq=last_seq)
        verdict = _verdict(tail, generation, raw_seq, str(raw["type"]), msg_id)
        if verdict is not None:
            return verdict
        # Not validated again: Postgres wrote it from validated data.
        frame = Frame.model_construct(
            run_id=run_id, seq=tail.seq + 1, type=FrameType(raw["type"]), data=raw["data"], at=at
        )
        body = frame.model_dump_json().encode()
        try:
            sent = await broker.send_frame(
                tenant, frame, body, generation, raw_seq, tail.stream_seq, traceparent=traceparent
            )
            await sent
            return Placed.STORED
        except ChainMoved:
            continue  # another frame came first: read the run's end again
    raise Unavailable(f"frame {raw_seq} of attempt {generation} of run {run_id} not placed")
