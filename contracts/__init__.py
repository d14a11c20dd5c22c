"""The runwire wire contract (v1): every command, reply, frame, status and error code.

This package is pure data: pydantic models and subject names, no I/O. Services and
clients both import it; it imports nothing of ours.
"""

from contracts.commands import (
    AbortSessionCommand,
    CancelCommand,
    GetCommand,
    JoinCommand,
    Multitask,
    SubmitCommand,
)
from contracts.errors import ErrorBody, ErrorCode, ErrorReply
from contracts.events import RunEvent, RunEventName
from contracts.frames import (
    FRAME_DATA,
    CheckpointData,
    DoneData,
    Frame,
    FrameType,
    Job,
    MessageData,
    RawFrame,
    RunData,
    StatusData,
    ToolCallData,
    ToolResultData,
    typed_data,
)
from contracts.replies import (
    AbortSessionReply,
    FrameChannel,
    JoinReply,
    LiveCursor,
    RunReply,
    RunSummary,
    SubmitReply,
)
from contracts.scripted import ScriptedFailure, ScriptedInput
from contracts.status import TERMINAL_STATUSES, RunStatus
from contracts.subjects import DEFAULT_PREFIX, DEFAULT_TENANT, Subjects

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
    "typed_data",
]
