"""What a run is made of from its submit command: its input, and when it may start."""

from datetime import UTC, datetime, timedelta
from typing import Any

from runwire.contracts import commands


def run_input(cmd: commands.SubmitCommand) -> dict[str, Any]:
    """The run's input: the submit's (a workflow's input for a workflow run), or for a
    coalesced run the list its submits add to."""
    if cmd.workflow is not None:
        return cmd.workflow.input
    if cmd.multitask == commands.Multitask.COALESCE:
        return {"inputs": [cmd.input]}
    return cmd.input


def start_time(not_before: datetime | None, delay_ms: int | None) -> datetime | None:
    """When a run may start: `not_before`, or `delay_ms` from now (None: at once)."""
    if delay_ms is not None:
        return datetime.now(UTC) + timedelta(milliseconds=delay_ms)
    return not_before
