"""Stable error codes and the error reply every command may answer with."""

from enum import StrEnum
from typing import Literal

from runwire.contracts.base import Versioned, WireModel


class ErrorCode(StrEnum):
    """Error codes of the wire contract. Stable: clients branch on them."""

    INVALID_REQUEST = "INVALID_REQUEST"
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
    NOT_FOUND = "NOT_FOUND"
    SESSION_BUSY = "SESSION_BUSY"
    QUEUE_FULL = "QUEUE_FULL"
    QUEUE_TIMEOUT = "QUEUE_TIMEOUT"
    ATTEMPT_TIMEOUT = "ATTEMPT_TIMEOUT"
    RUNNER_ERROR = "RUNNER_ERROR"
    RUNNER_FATAL = "RUNNER_FATAL"
    # The configuration a run was pinned to (for a model runner: model, base URL,
    # sampling settings) is not the one its attempt would run with. Not retryable.
    MODEL_CHANGED = "MODEL_CHANGED"
    # A side effect's dispatch ran past its deadline: failed, once. Not retryable.
    EFFECT_DEADLINE_EXCEEDED = "EFFECT_DEADLINE_EXCEEDED"
    # A side effect failed for good (the adapter refused it). Not retryable.
    EFFECT_FAILED = "EFFECT_FAILED"
    # A side effect's claim found the run's authorization stale: its tenant's policy
    # changed after the run was submitted. The effect failed, never dispatched. Not
    # retryable.
    AUTHORIZATION_STALE = "AUTHORIZATION_STALE"
    # A reservation did not fit the tenant's or the run's budget. Not retryable.
    BUDGET_EXCEEDED = "BUDGET_EXCEEDED"
    # A submit that a quota of the tenant refuses (runs active at once, runs per day):
    # nothing was created. Not retryable.
    QUOTA_EXCEEDED = "QUOTA_EXCEEDED"
    # A node of a workflow run failed for good and its on_failure (retry, fail_run) ends
    # the run: the run fails with it. Not retryable.
    NODE_FAILED = "NODE_FAILED"
    # A node ran past its deadline_ms (retries included): it timed out, once. Not
    # retryable.
    NODE_DEADLINE_EXCEEDED = "NODE_DEADLINE_EXCEEDED"
    # A `resume` or `signal` names a run that does not wait (or not for that wait): it
    # was not answered. Not retryable.
    NOT_WAITING = "NOT_WAITING"
    # A `reschedule` names a run that has its job already (it started, or is about to) or
    # has ended: not rescheduled. Not retryable.
    NOT_RESCHEDULABLE = "NOT_RESCHEDULABLE"
    # A wait of the run ran past its timeout and the runner did not handle it. Not
    # retryable.
    WAIT_TIMEOUT = "WAIT_TIMEOUT"
    CANCELED = "CANCELED"
    SUPERSEDED = "SUPERSEDED"
    INTERRUPTED = "INTERRUPTED"
    UNAVAILABLE = "UNAVAILABLE"
    UNAUTHORIZED = "UNAUTHORIZED"


class ErrorBody(WireModel):
    """What went wrong, and whether trying again may succeed."""

    code: ErrorCode
    message: str
    retryable: bool


class ErrorReply(Versioned):
    """A command's answer when it failed."""

    ok: Literal[False] = False
    error: ErrorBody
