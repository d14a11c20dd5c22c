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
from contracts.frames import Frame, FrameType, Job, RawFrame
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
    "TERMINAL_STATUSES",
    "AbortSessionCommand",
    "AbortSessionReply",
    "CancelCommand",
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
    "Multitask",
    "RawFrame",
    "RunEvent",
    "RunEventName",
    "RunReply",
    "RunStatus",
    "RunSummary",
    "ScriptedFailure",
    "ScriptedInput",
    "Subjects",
    "SubmitCommand",
    "SubmitReply",
]
