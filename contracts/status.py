"""Run statuses, defined once; the Postgres enum `run_status` mirrors it."""

from enum import StrEnum


class RunStatus(StrEnum):
    """Where a run is in its lifecycle (see DESIGN.md, Run lifecycle)."""

    QUEUED = "queued"
    RUNNING = "running"
    RECOVERING = "recovering"
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
