"""A span in a run's trace for each decision recovery makes about the run."""

from contextlib import AbstractContextManager

from opentelemetry.trace import Span

from runwire.runtime import tracing
from runwire.runtime.store import Run

ACTOR = "recovery"


def decision_span(run: Run, decision: str) -> AbstractContextManager[Span]:
    """The "recovery decision" span of `run`, child of the run's trace."""
    attributes = tracing.run_attributes(
        run.run_id, run.tenant, attempt=run.attempts, generation=run.generation
    )
    return tracing.span(
        "recovery decision",
        tracing.context_of(run.trace_parent),
        attributes={**attributes, "decision": decision},
    )
