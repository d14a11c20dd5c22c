"""How the gateway answers what went wrong: the HTTP status of each wire error code, and
a validation error in a line."""

from pydantic import ValidationError

from runwire.contracts.errors import ErrorBody, ErrorCode

# The HTTP status of each error code a reply may carry; a code not listed is 503 when
# retryable, else 500.
STATUS: dict[ErrorCode, int] = {
    ErrorCode.INVALID_REQUEST: 400,
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.SESSION_BUSY: 409,
    ErrorCode.NOT_WAITING: 409,
    ErrorCode.NOT_RESCHEDULABLE: 409,
    ErrorCode.PAYLOAD_TOO_LARGE: 413,
    ErrorCode.QUOTA_EXCEEDED: 429,
    ErrorCode.QUEUE_FULL: 429,
    ErrorCode.UNAVAILABLE: 503,
}


def status_of(error: ErrorBody) -> int:
    return STATUS.get(error.code, 503 if error.retryable else 500)


def described(exc: ValidationError) -> str:
    """A validation error in a line: where, and what is wrong."""
    parts = []
    for error in exc.errors()[:3]:
        where = ".".join(str(p) for p in error["loc"]) or "body"
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)
