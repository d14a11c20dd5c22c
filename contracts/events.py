"""Run events: every recorded transition of a run, on `<prefix>.<tenant>.events.<run_id>`."""

from enum import StrEnum

from pydantic import AwareDatetime

from runwire.contracts.base import Versioned
from runwire.contracts.status import RunStatus


class RunEventName(StrEnum):
    """What happened to a run; a CHECK on `run_events.event` mirrors this list."""

    SUBMITTED = "submitted"  # accepted (queued, or waiting for its session)
    CLAIMED = "claimed"  # an attempt started
    FINISHED = "finished"  # the runner returned
    FAILED = "failed"  # a fatal error, attempts exhausted, queue full or queue timeout
    CANCELED = "canceled"  # closed by a cancel (or superseded by a newer run)
    RETRY = "retry"  # an attempt failed; the next one is queued after a backoff
    RELEASED = "released"  # an executor shutting down returned its attempt to the queue
    CANCEL_REQUESTED = "cancel_requested"  # a running run was asked to stop
    SESSION_TURN = "session_turn"  # the earlier runs of its session ended: its turn came
    RECOVERING = "recovering"  # its executor stopped renewing the lease; resumed elsewhere
    INTERRUPTED = "interrupted"  # closed after repeated recoveries without progress
    BUDGET_RESERVED = "budget_reserved"  # tokens (and cost units) reserved for a costly call
    BUDGET_SETTLED = "budget_settled"  # a reservation settled with what the call used
    BUDGET_RELEASED = "budget_released"  # a reservation nobody will settle was released
    EFFECT_RESOLVED = "effect_resolved"  # an operator settled an effect (resolve_effect)


class RunEvent(Versioned):
    """One transition: what happened (`event`), the status after it, and when."""

    run_id: str
    session_id: str | None
    event: RunEventName
    status: RunStatus
    attempt: int
    code: str | None = None
    at: AwareDatetime
