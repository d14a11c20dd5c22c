"""Run statuses, defined once; the Postgres enum `run_status` mirrors it."""

from enum import StrEnum


class RunStatus(StrEnum):
    """Where a run is in its lifecycle (see DESIGN.md, Run lifecycle)."""

    QUEUED = "queued"
    RUNNING = "running"
    RECOVERING = "recovering"
    # Its attempt ended to wait for an answer, a signal or a timer: no worker is held,
    # and an answer (or the wait's timeout) queues its next attempt.
    WAITING = "waiting"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELED = "canceled"
    INTERRUPTED = "interrupted"

    @property
    def terminal(self) -> bool:
        """A terminal run never changes again."""
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset(
    {RunStatus.FINISHED, RunStatus.FAILED, RunStatus.CANCELED, RunStatus.INTERRUPTED}
)
