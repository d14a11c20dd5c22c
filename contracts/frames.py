"""Frames (what a run produces) and the job message that queues an attempt."""

from enum import StrEnum
from typing import Any

from pydantic import AwareDatetime, Field

from contracts.base import Versioned


class FrameType(StrEnum):
    """The kinds of frame a run emits; `done` is always last."""

    RUN = "run"
    MESSAGE = "message"
    TOOL_CALL = "tool_call"
    TOOL_RESULT = "tool_result"
    CHECKPOINT = "checkpoint"
    STATUS = "status"
    ERROR = "error"
    DONE = "done"


# Frames that the relay writes to Postgres at once instead of batching.
URGENT_FRAME_TYPES = frozenset(
    {FrameType.RUN, FrameType.TOOL_CALL, FrameType.TOOL_RESULT, FrameType.ERROR, FrameType.DONE}
)


class Frame(Versioned):
    """A frame as clients see it on `<prefix>.<tenant>.runs.<run_id>.frames`.

    `seq` strictly increases within a run across all its attempts, so a client's
    cursor (the last `seq` it saw) stays valid whatever happens to the run.
    """

    run_id: str
    seq: int = Field(ge=1)
    type: FrameType
    data: dict[str, Any] = Field(default_factory=dict)
    at: AwareDatetime


class RawFrame(Versioned):
    """A frame as an attempt publishes it, before the relay orders and numbers it.

    `seq` counts within one attempt (its `generation`), from 1; the relay drops frames
    of a stale generation and gives each kept frame its run-wide `seq`.
    """

    run_id: str
    tenant: str
    generation: int = Field(ge=0)
    seq: int = Field(ge=1)
    type: FrameType
    data: dict[str, Any] = Field(default_factory=dict)
    at: AwareDatetime


class Job(Versioned):
    """A queued attempt: "look at run X, generation G". Postgres holds the rest."""

    run_id: str
    tenant: str
    generation: int = Field(ge=0)
