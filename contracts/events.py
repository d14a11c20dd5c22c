"""Run events: every recorded transition of a run, on `<prefix>.<tenant>.events.<run_id>`."""

from pydantic import AwareDatetime

from contracts.base import Versioned
from contracts.status import RunStatus


class RunEvent(Versioned):
    """One transition: what happened (`event`), the status after it, and when.

    `event` names the transition (`submitted`, `claimed`, `retry`, `released`,
    `recovering`, `cancel_requested`, `finished`, `failed`, `canceled`, `interrupted`, ...).
    """

    run_id: str
    session_id: str | None
    event: str
    status: RunStatus
    attempt: int
    code: str | None = None
    at: AwareDatetime
