"""Successful command replies and the run summary they carry."""

from typing import Any, Literal

from pydantic import AwareDatetime, Field

from contracts.base import Versioned, WireModel
from contracts.errors import ErrorBody
from contracts.frames import Frame
from contracts.status import RunStatus


class RunSummary(WireModel):
    """A run as clients see it. Times are RFC 3339 in UTC."""

    run_id: str
    tenant: str
    session_id: str | None
    request_id: str
    status: RunStatus
    attempts: int
    generation: int
    created_at: AwareDatetime
    started_at: AwareDatetime | None
    ended_at: AwareDatetime | None
    updated_at: AwareDatetime
    last_seq: int
    result: dict[str, Any] | None = None
    error: ErrorBody | None = None


class SubmitReply(Versioned):
    """The run a submit created, or the first run of that `request_id`."""

    ok: Literal[True] = True
    run: RunSummary
    duplicate: bool


class RunReply(Versioned):
    """The answer of `get` and `cancel`."""

    ok: Literal[True] = True
    run: RunSummary


class AbortSessionReply(Versioned):
    """The runs that `abort_session` canceled."""

    ok: Literal[True] = True
    canceled: list[str]


class LiveCursor(WireModel):
    """Where to continue after a join's replay: deliver by start sequence."""

    stream: str
    subject: str
    stream_seq: int = Field(ge=1)


class JoinReply(Versioned):
    """Every frame after the cursor known so far, and where live frames continue.

    `live` is null when the run has ended and `replay` is complete.
    """

    ok: Literal[True] = True
    run: RunSummary
    replay: list[Frame]
    live: LiveCursor | None
