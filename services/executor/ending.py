"""How an attempt ended, and the error a run records when runwire's own infrastructure
ended it."""

import logging
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from runwire.contracts.errors import ErrorBody, ErrorCode
from runwire.runtime.errors import RunwireError
from runwire.runtime.storable import storable_text

log = logging.getLogger(__name__)

# What a run records when its attempt failed on Postgres or NATS (see `attempt_error`).
ATTEMPT_UNAVAILABLE_MESSAGE = (
    "the attempt could not reach runwire's store or broker; the executor logged the "
    "details with the run_id"
)


def attempt_error(exc: RunwireError, retryable: bool) -> ErrorBody:
    """The error a run records for a runwire error that ended its attempt. One of
    runwire's infrastructure (Postgres or NATS away or refusing, code UNAVAILABLE) says
    so and no more: what the driver said (a query, an address) stays in the log, as it
    does for a command's reply."""
    if exc.code != ErrorCode.UNAVAILABLE:
        return ErrorBody(code=exc.code, message=storable_text(exc.message), retryable=retryable)
    log.warning("the attempt failed on runwire's store or broker: %s", exc.message)
    return ErrorBody(code=exc.code, message=ATTEMPT_UNAVAILABLE_MESSAGE, retryable=retryable)


class AbortReason(StrEnum):
    """Why an attempt was stopped before its runner returned."""

    CANCEL = "cancel"
    TIMEOUT = "timeout"
    SHUTDOWN = "shutdown"
    LOST = "lost"


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended: exactly one of result, error, abort, wait or limited is set."""

    result: dict[str, Any] | None = None
    error: ErrorBody | None = None
    abort: AbortReason | None = None
    # The wait the attempt ended for (the run waits).
    wait: str | None = None
    # A model call had no room under a rate limit: until when, under which limit.
    limited: tuple[datetime, str] | None = None
    # The soonest the next attempt may start after a retryable error (Retry-After).
    retry_after_ms: int | None = None
