"""Frames (what a run produces) and the job message that queues an attempt."""

from enum import StrEnum
from typing import Any, Self

from pydantic import AwareDatetime, Field, ValidationInfo, model_validator

from runwire.contracts.base import Versioned, WireModel
from runwire.contracts.errors import ErrorBody, ErrorCode
from runwire.contracts.status import RunStatus
from runwire.contracts.subjects import RUNNER_NAME_PATTERN
from runwire.contracts.workflows import NodeData


class FrameType(StrEnum):
    """The kinds of frame a run emits; `done` is always last."""

    RUN = "run"
    MESSAGE = "message"
    TOOL_CALL = "tool_call"
    TOOL_RESULT = "tool_result"
    USAGE = "usage"
    EFFECT = "effect"
    CHECKPOINT = "checkpoint"
    STATUS = "status"
    NODE = "node"
    WAIT = "wait"
    ERROR = "error"
    DONE = "done"


# Frames that the relay writes to Postgres at once instead of batching (a join reads
# the frames not written yet from the stream; these are the ones a reader of Postgres
# alone, or a run that then waits long, should find written at once).
URGENT_FRAME_TYPES = frozenset(
    {
        FrameType.TOOL_CALL,
        FrameType.TOOL_RESULT,
        FrameType.EFFECT,
        FrameType.NODE,
        FrameType.WAIT,
        FrameType.ERROR,
        FrameType.DONE,
    }
)


class RunData(WireModel):
    """`run`: an attempt starts.

    A resumed attempt continues the text of the run's `message` frames up to seq
    `resume_after` (the frames stored when it started; after a retry, the failed
    attempt's closing `error` frame among them): a client drops the `message`
    frames it holds with a higher seq, and appends what follows. `partial_length` is the
    length of that text in Unicode code points (not UTF-16 units: a JavaScript client
    cuts by `resume_after`, never by `partial_length`).
    """

    attempt: int = Field(ge=1)
    resumed: bool
    partial_length: int = Field(ge=0)
    resume_after: int | None = Field(default=None, ge=0)


class MessageData(WireModel):
    """`message`: a text delta; the run's text is the deltas joined in seq order."""

    text: str


class ToolCallData(WireModel):
    """`tool_call`: the runner calls a tool (`id` pairs it with its `tool_result`)."""

    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolResultData(WireModel):
    """`tool_result`: what the tool call `id` returned, or the error it raised."""

    id: str
    name: str
    output: Any = None
    error: str | None = None


class UsageData(WireModel):
    """`usage`: the tokens one model call of the run took (one frame per call)."""

    input_tokens: int = Field(ge=0)
    output_tokens: int = Field(ge=0)
    total_tokens: int = Field(ge=0)
    model: str | None = None


class EffectState(StrEnum):
    """Where a side effect stands. `prepared` → `claimed` → `committed`, `failed` or
    `unknown`; an `unknown` one becomes `reconciled` (with a receipt) or `failed`."""

    PREPARED = "prepared"
    CLAIMED = "claimed"
    COMMITTED = "committed"
    FAILED = "failed"
    UNKNOWN = "unknown"
    RECONCILED = "reconciled"


class EffectData(WireModel):
    """`effect`: a side effect of the run changed state (its `key` is the runner's name
    for the action within the run; `receipt_id` is the adapter's, once committed)."""

    key: str
    kind: str
    state: EffectState
    receipt_id: str | None = None
    error: str | None = None


class CheckpointData(WireModel):
    """`checkpoint`: progress saved; a resumed attempt starts from `state`."""

    state: Any


class StatusData(WireModel):
    """`status`: what the runner is doing now, in its own words (e.g. "searching")."""

    status: str


class WaitKind(StrEnum):
    INTERRUPT = "interrupt"  # a question; `resume` answers it
    SIGNAL = "signal"  # an event sent to the run by name (`signal`)
    SLEEP = "sleep"  # a durable timer: `timeout_at` ends it


class WaitData(WireModel):
    """`wait`: the run waits, its attempt ended (no worker held), for the answer to
    `payload` (`interrupt`), for the signal `name` (`signal`) or for `timeout_at`
    (`sleep`), until `timeout_at` (none: no deadline). `wait_id` names the wait within
    the run; `resume` may give it."""

    wait_id: str
    kind: WaitKind
    payload: Any = None
    name: str | None = None
    timeout_at: AwareDatetime | None = None


class DoneData(WireModel):
    """`done`: the run's terminal status, and its error code when it did not finish."""

    status: RunStatus
    code: ErrorCode | None = None


# The model of each frame type's `data` (an `error` frame's is the wire's ErrorBody).
FRAME_DATA: dict[FrameType, type[WireModel]] = {
    FrameType.RUN: RunData,
    FrameType.MESSAGE: MessageData,
    FrameType.TOOL_CALL: ToolCallData,
    FrameType.TOOL_RESULT: ToolResultData,
    FrameType.USAGE: UsageData,
    FrameType.EFFECT: EffectData,
    FrameType.CHECKPOINT: CheckpointData,
    FrameType.STATUS: StatusData,
    FrameType.NODE: NodeData,
    FrameType.WAIT: WaitData,
    FrameType.ERROR: ErrorBody,
    FrameType.DONE: DoneData,
}


# Validation context for frames whose data was checked when they were made (a relay
# reading back its own segments): `Frame.model_validate(body, context={CHECKED: True})`.
CHECKED = "data_checked"


def typed_data(type: FrameType, data: dict[str, Any]) -> WireModel:
    """`data` as the model of its frame type; a ValidationError when it does not fit."""
    return FRAME_DATA[type].model_validate(data)


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

    @model_validator(mode="after")
    def _data_fits_type(self, info: ValidationInfo) -> Self:
        if not (info.context or {}).get(CHECKED):
            typed_data(self.type, self.data)
        return self


# A run id is a UUID (as Postgres writes it); a generation fits Postgres's integer.
RUN_ID_PATTERN = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
MAX_GENERATION = 2**31 - 1


class Job(Versioned):
    """A queued attempt: "look at run X, generation G". Postgres holds the rest."""

    run_id: str = Field(pattern=RUN_ID_PATTERN)
    tenant: str
    runner: str = Field(pattern=RUNNER_NAME_PATTERN)
    generation: int = Field(ge=0, le=MAX_GENERATION, strict=True)


class Transcript:
    """The text of a run as its frames are applied in seq order, with each resumed
    attempt's cut (`RunData.resume_after`; before it, `partial_length`)."""

    def __init__(self) -> None:
        self._pieces: list[tuple[int, str]] = []
        self._joined: str | None = ""

    @property
    def text(self) -> str:
        if self._joined is None:
            self._joined = "".join(text for _, text in self._pieces)
        return self._joined

    def apply(self, frame: Frame) -> None:
        if frame.type == FrameType.MESSAGE:
            self._pieces.append((frame.seq, str(frame.data.get("text", ""))))
            self._joined = None
        elif frame.type == FrameType.RUN and frame.data.get("resumed"):
            after = frame.data.get("resume_after")
            if after is not None:
                while self._pieces and self._pieces[-1][0] > int(after):
                    self._pieces.pop()
            else:
                kept = self.text[: int(frame.data.get("partial_length", len(self.text)))]
                self._pieces = [(0, kept)] if kept else []
            self._joined = None
