"""Refusals as LangGraph's server words them: a status and `{"detail": ...}`."""

from typing import Any


class Refused(Exception):
    """A request answered with a status and `{"detail": ...}`, as LangGraph's server
    answers (the SDK raises ConflictError on 409, NotFoundError on 404, ...)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


def one_of(field: str, value: Any, allowed: list[str]) -> None:
    if value is not None and value not in allowed:
        raise Refused(422, f"{field}: {value!r} is not one of {', '.join(allowed)}")
