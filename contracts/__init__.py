"""The runwire wire contract (v1): every command, reply, frame, status and error code.

This package is pure data: pydantic models and subject names, no I/O. Services and
clients both import it; it imports nothing of ours.
"""

from runwire.contracts.commands import (
    AbortSessionCommand,
    CancelCommand,
    GetCommand,
    JoinCommand,
    Multitask,
    ResolveEffectCommand,
    SubmitCommand,
)
from runwire.contracts.errors import ErrorBody, ErrorCode, ErrorReply
from runwire.contracts.events import RunEvent, RunEventName
from runwire.contracts.frames import (
    FRAME_DATA,
    CheckpointData,
    DoneData,
    EffectData,
    EffectState,
    Frame,
    FrameType,
    Job,
    MessageData,
    RawFrame,
    RunData,
    StatusData,
    ToolCallData,
    ToolResultData,
    Transcript,
    UsageData,
    typed_data,
)
from runwire.contracts.replies import (
    AbortSessionReply,
    FrameChannel,
    JoinReply,
    LiveCursor,
    RunReply,
    RunSummary,
    SubmitReply,
)
from runwire.contracts.scripted import ScriptedFailure, ScriptedInput
from runwire.contracts.status import TERMINAL_STATUSES, RunStatus
from runwire.contracts.subjects import DEFAULT_PREFIX, DEFAULT_TENANT, Subjects

__all__ = [
    "DEFAULT_PREFIX",
    "DEFAULT_TENANT",
    "FRAME_DATA",
    "TERMINAL_STATUSES",
    "AbortSessionCommand",
    "AbortSessionReply",
    "CancelCommand",
    "CheckpointData",
    "DoneData",
    "EffectData",
    "EffectState",
    "ErrorBody",
    "ErrorCode",
    "ErrorReply",
    "Frame",
    "FrameChannel",
    "FrameType",
    "GetCommand",
    "Job",
    "JoinCommand",
    "JoinReply",
    "LiveCursor",
    "MessageData",
    "Multitask",
    "RawFrame",
    "ResolveEffectCommand",
    "RunData",
    "RunEvent",
    "RunEventName",
    "RunReply",
    "RunStatus",
    "RunSummary",
    "ScriptedFailure",
    "ScriptedInput",
    "StatusData",
    "Subjects",
    "SubmitCommand",
    "SubmitReply",
    "ToolCallData",
    "ToolResultData",
    "Transcript",
    "UsageData",
    "typed_data",
]
