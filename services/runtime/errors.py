"""One root exception; subclasses carry the wire code and whether a retry may help."""

from runwire.contracts.errors import ErrorBody, ErrorCode

INTERRUPTED_MESSAGE = (
    "the reply could not be completed after repeated failures of its executor; it may be retried"
)
# The errors runs are closed with, defined once for every service.
CANCELED_ERROR = ErrorBody(code=ErrorCode.CANCELED, message="canceled by request", retryable=False)
SUPERSEDED_ERROR = ErrorBody(
    code=ErrorCode.SUPERSEDED,
    message="superseded by a newer run of its session",
    retryable=False,
)
QUEUE_FULL_ERROR = ErrorBody(
    code=ErrorCode.QUEUE_FULL, message="the queue is full; submit again later", retryable=True
)
QUEUE_TIMEOUT_ERROR = ErrorBody(
    code=ErrorCode.QUEUE_TIMEOUT,
    message="the run waited in the queue past its queue timeout",
    retryable=True,
)
UNSERVED_ERROR = ErrorBody(
    code=ErrorCode.QUEUE_TIMEOUT,
    message=(
        "no executor serves the run's runner: the run waited in the queue past the limit "
        "of such a run (RUNWIRE_UNSERVED_TIMEOUT_MS)"
    ),
    retryable=True,
)
INTERRUPTED_ERROR = ErrorBody(
    code=ErrorCode.INTERRUPTED, message=INTERRUPTED_MESSAGE, retryable=True
)


class RunwireError(Exception):
    """Root of every error runwire raises on purpose."""

    code: ErrorCode = ErrorCode.UNAVAILABLE
    retryable: bool = True

    def __init__(self, message: str, *, run_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.run_id = run_id

    def body(self) -> ErrorBody:
        """The `{code, message, retryable}` a command replies with."""
        return ErrorBody(code=self.code, message=self.message, retryable=self.retryable)


class InvalidRequest(RunwireError):
    code = ErrorCode.INVALID_REQUEST
    retryable = False


class PayloadTooLarge(RunwireError):
    code = ErrorCode.PAYLOAD_TOO_LARGE
    retryable = False


class NotFound(RunwireError):
    code = ErrorCode.NOT_FOUND
    retryable = False


class NotWaiting(RunwireError):
    code = ErrorCode.NOT_WAITING
    retryable = False


class QuotaExceeded(RunwireError):
    code = ErrorCode.QUOTA_EXCEEDED
    retryable = False


class QueueFull(RunwireError):
    code = ErrorCode.QUEUE_FULL
    retryable = True


class Unavailable(RunwireError):
    code = ErrorCode.UNAVAILABLE
    retryable = True


class MigrationFailed(Unavailable):
    """A schema migration's SQL failed: the service cannot start, and trying again will
    not help (unlike Postgres not being up yet)."""

    retryable = False


class MigrationsPending(Unavailable):
    """The schema lacks migrations that this connection's role may not apply (a service
    connected as its own role): the owner applies them; until then, wait."""


class LostRace(RunwireError):
    """A guarded write changed nothing: another writer (or a newer attempt) got there first."""

    code = ErrorCode.UNAVAILABLE
    retryable = False


class StoreError(RunwireError):
    """Postgres refused a statement (a bug or a constraint), not a connection problem."""

    code = ErrorCode.UNAVAILABLE
    retryable = True


class StoreRefused(StoreError):
    """Postgres refused what a statement holds (a data exception or an integrity
    violation, SQLSTATE class 22 or 23): the same statement would fail again, unlike one
    rolled back for a deadlock."""
