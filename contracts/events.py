"""Run events: every recorded transition of a run, on `<prefix>.<tenant>.events.<run_id>`."""

from enum import StrEnum

from pydantic import AwareDatetime

from runwire.contracts.base import Versioned
from runwire.contracts.status import RunStatus


class RunEventName(StrEnum):
    """What happened to a run; a CHECK on `run_events.event` mirrors this list."""

    SUBMITTED = "submitted"  # accepted (queued, or waiting for its session or share)
    CLAIMED = "claimed"  # an attempt started
    FINISHED = "finished"  # the runner returned
    FAILED = "failed"  # a fatal error, attempts exhausted, queue full or queue timeout
    CANCELED = "canceled"  # closed by a cancel (or superseded by a newer run)
    RETRY = "retry"  # an attempt failed; the next one is queued after a backoff
    RELEASED = "released"  # an executor shutting down returned its attempt to the queue
    CANCEL_REQUESTED = "cancel_requested"  # a running run was asked to stop
    SESSION_TURN = "session_turn"  # the earlier runs of its session ended: its turn came
    SHARE_TURN = "share_turn"  # its tenant's share of executor slots had room: job issued
    RESCHEDULED = "rescheduled"  # a waiting run's start time was moved (`reschedule`)
    RECOVERING = "recovering"  # its executor stopped renewing the lease; resumed elsewhere
    INTERRUPTED = "interrupted"  # closed after repeated recoveries without progress
    # Its model call found no room under a rate limit: back to the queue, not counted.
    RATE_LIMITED = "rate_limited"
    RATE_GRANTED = "rate_granted"  # room came under its rate limits: job issued at once
    WAITING = "waiting"  # its attempt ended to wait (an interrupt, a signal): no worker held
    RESUMED = "resumed"  # its wait was answered, signaled or timed out: next attempt queued
    SIGNALED = "signaled"  # a signal was sent to it (kept until a wait of it takes it)
    BUDGET_RESERVED = "budget_reserved"  # tokens (and cost units) reserved for a costly call
    BUDGET_SETTLED = "budget_settled"  # a reservation settled with what the call used
    BUDGET_RELEASED = "budget_released"  # a reservation nobody will settle was released
    EFFECT_RESOLVED = "effect_resolved"  # an operator settled an effect (resolve_effect)
    # A node run of a workflow run changed (`node` names it; numbered by `seq`).
    NODE_READY = "node_ready"  # created: every node before it ended
    NODE_STARTED = "node_started"  # an attempt of it started
    NODE_RETRYING = "node_retrying"  # an attempt failed; another follows after a backoff
    NODE_WAITING = "node_waiting"  # its executor stopped, or its run waits (an answer)
    NODE_RESUMED = "node_resumed"  # the wait of its run was decided: next attempt queued
    NODE_COMPLETED = "node_completed"
    NODE_FAILED = "node_failed"
    NODE_FELL_BACK = "node_fell_back"  # failed; its fallback node runs in its place
    NODE_SKIPPED = "node_skipped"  # failed; the nodes after it run without its output
    NODE_TIMED_OUT = "node_timed_out"  # its deadline passed


class RunEvent(Versioned):
    """One transition: what happened (`event`), the status after it, and when."""

    run_id: str
    session_id: str | None
    event: RunEventName
    status: RunStatus
    attempt: int
    code: str | None = None
    at: AwareDatetime
    # Node events of a workflow run: the node, and the event's number within the run
    # (1, 2, ... in the order they happened; their `at` never goes backwards).
    node: str | None = None
    seq: int | None = None
