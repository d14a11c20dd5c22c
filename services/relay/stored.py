"""A frame as the frames stream stored it, read back and checked.

Attempts (and the outbox, for the closing frames Postgres writes) publish each client
frame once on `frames_out`, numbered with the run's `seq`, with its position in an
`Rw-Pos` header; the stream stores it under the run's client subject. What the relay
archives must be exactly that: a `Frame` of the subject's run whose `seq` and type agree
with its header. Anything else is malformed: the relay logs it with its run and
terminates it, and it holds nothing up.
"""

from dataclasses import dataclass

from pydantic import ValidationError

from runwire.contracts.frames import Frame, FrameType
from runwire.contracts.headers import TRACEPARENT
from runwire.contracts.subjects import Subjects
from runwire.runtime.storable import NUL_ESCAPE, storable
from runwire.runtime.stream_reads import FramePosition, frame_position


class MalformedFrame(ValueError):
    """A message of the frames stream that is not a frame the relay can archive."""

    def __init__(self, reason: str, tenant: str, run_id: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.tenant = tenant
        self.run_id = run_id


@dataclass(frozen=True, slots=True)
class StoredFrame:
    """One run's frame as stored: what a segment keeps of it (`body`, its JSON text) and
    where it stands (its run-wide `seq`, its stream sequence, its attempt)."""

    tenant: str
    frame: Frame
    body: str
    position: FramePosition
    stream_seq: int
    traceparent: str | None

    @property
    def run_id(self) -> str:
        return self.frame.run_id

    @property
    def seq(self) -> int:
        return self.frame.seq

    @property
    def is_done(self) -> bool:
        return self.frame.type == FrameType.DONE


def _run_of(subject: str) -> tuple[str, str]:
    """(tenant, run id) of a client frames subject, `<prefix>.<tenant>.runs.<run>.frames`
    ("" for a subject of another shape)."""
    tokens = subject.split(".")
    if len(tokens) != 5 or tokens[2] != "runs" or tokens[4] != "frames":
        return "", ""
    return tokens[1], Subjects.run_of_frames(subject)


def parse_stored(
    subject: str, headers: dict[str, str] | None, data: bytes, stream_seq: int
) -> StoredFrame:
    """The stored frame of one message of the frames stream; MalformedFrame when it is
    not one (no or a damaged `Rw-Pos`, a body that is not a `Frame`, a frame of another
    run than its subject's, or a header that disagrees with the body)."""
    tenant, run_id = _run_of(subject)
    if not run_id:
        raise MalformedFrame(f"not a run's frames subject: {subject}", tenant, run_id)
    position = frame_position(headers or {})
    if position is None:
        raise MalformedFrame("no readable Rw-Pos header", tenant, run_id)
    try:
        frame = Frame.model_validate_json(data)
    except ValidationError as exc:
        raise MalformedFrame(f"not a frame: {exc}", tenant, run_id) from exc
    if frame.run_id != run_id:
        raise MalformedFrame(f"a frame of run {frame.run_id} on this run's subject", tenant, run_id)
    if (position.seq, position.type) != (frame.seq, frame.type.value):
        raise MalformedFrame(
            f"Rw-Pos says seq {position.seq} ({position.type}), the body seq {frame.seq} "
            f"({frame.type.value})",
            tenant,
            run_id,
        )
    body = data.decode()
    if NUL_ESCAPE in data:
        # Postgres cannot store a NUL (an attempt replaces it; an older or faulty one may
        # not): the segment keeps U+FFFD in its place, or the run's segment could not be
        # written at all.
        frame = frame.model_copy(update={"data": storable(frame.data)})
        body = frame.model_dump_json()
    traceparent = (headers or {}).get(TRACEPARENT)
    return StoredFrame(tenant, frame, body, position, stream_seq, traceparent)
