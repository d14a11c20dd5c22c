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

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from runwire.contracts.frames import Frame, FrameType
from runwire.runtime.broker import HDR_MSG_ID, Broker, ChainMoved, frame_msg_id
from runwire.runtime.errors import Unavailable
from runwire.runtime.stream_reads import frame_position

log = logging.getLogger(__name__)

# How many times a frame is placed again after others were stored before it.
APPEND_TRIES = 8
# A frame whose predecessor is not stored yet is looked at again after GAP_RETRY_S, up
# to GAP_TRIES times (then recovery's sweep tries it again later); once it is
# GAP_GIVE_UP_S old, what is missing before it is taken as lost for good.
GAP_RETRY_S = 0.05
GAP_TRIES = 20
GAP_GIVE_UP_S = 20.0


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


class _Gap(Exception):
    """The frame before this one (of its attempt) is not stored yet."""


def _verdict(
    tail: Tail, generation: int, raw_seq: int, msg_id: str, given_up: bool
) -> Placed | None:
    """Whether a frame Postgres wrote (attempt `generation`, the `raw_seq`-th of it) is to
    be published after `tail` (None), or is not needed; _Gap while the frame before it
    is missing (unless `given_up`: it is lost for good)."""
    if tail.msg_id == msg_id:
        return Placed.ALREADY
    if tail.type == FrameType.DONE.value or tail.generation > generation:
        return Placed.SUPERSEDED
    if tail.generation == generation and tail.raw_seq >= raw_seq:
        return Placed.ALREADY
    if tail.generation == generation:
        before = tail.raw_seq
    else:
        # None of its attempt's frames stored yet; when the stream holds none of the
        # run's at all but Postgres has some, it cannot tell: placed.
        before = raw_seq - 1 if tail.stream_seq == 0 and tail.seq else 0
    if before < raw_seq - 1 and not given_up:
        # The frame before it is on its way (another service's outbox publishes it, or
        # recovery's sweep will): never placed ahead of it.
        raise _Gap()
    return None


async def append(
    broker: Broker,
    raw: dict[str, Any],
    archived: Callable[[str], Awaitable[tuple[int, bool]]],
    *,
    traceparent: str | None = None,
    tail: Tail | None = None,
) -> Placed:
    """Publish a frame Postgres wrote (`raw`: the outbox row's body, with its run, tenant,
    generation, raw seq, type, data and time) after the run's last stored frame.
    `archived` gives a run's last archived seq and whether its frames are closed (asked
    only when the stream holds none of its frames); `tail`, where the run's frames
    end if the caller knows (the stream is asked when it does not, or was wrong)."""
    run_id, tenant = str(raw["run_id"]), str(raw["tenant"])
    generation, raw_seq = int(raw["generation"]), int(raw["seq"])
    at = datetime.fromisoformat(str(raw["at"]))
    msg_id = frame_msg_id(run_id, generation, raw_seq)
    given_up = (datetime.now(UTC) - at).total_seconds() > GAP_GIVE_UP_S
    gaps = 0
    known = tail
    for _ in range(APPEND_TRIES + GAP_TRIES):
        tail, known = known or await read_tail(broker, tenant, run_id), None
        if tail.stream_seq == 0:
            last_seq, closed = await archived(run_id)
            if closed:
                return Placed.SUPERSEDED
            tail = Tail(seq=last_seq)
        try:
            verdict = _verdict(tail, generation, raw_seq, msg_id, given_up)
        except _Gap:
            gaps += 1
            if gaps > GAP_TRIES:
                raise Unavailable(
                    f"frame {raw_seq} of attempt {generation} waits for the one before"
                ) from None
            await asyncio.sleep(GAP_RETRY_S)
            continue
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
