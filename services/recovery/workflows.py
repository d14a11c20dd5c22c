"""Workflow runs: what no run's own transition implies. A node run past its deadline
times out (once: fenced by its version), and its node's on_failure applies (a fallback
starts, the nodes after a skipped one start, or the workflow run fails); the runs of
node runs whose workflow run ended, which the end could not stop because a change of
their own held them, are stopped."""

from runwire.runtime import faults
from runwire.runtime.outbox import Outbox
from runwire.runtime.settings import RecoverySettings
from runwire.runtime.store import Store


class WorkflowDeadlines:
    """The duty that converges workflow runs with time."""

    name = "workflow deadlines"

    def __init__(self, settings: RecoverySettings, store: Store, outbox: Outbox) -> None:
        self.settings = settings
        self.store = store
        self.outbox = outbox

    async def run(self) -> dict[str, int]:
        timed_out, stopped, xact = await self.store.workflow_sweep(self.settings.batch_size)
        if timed_out:
            await faults.point(faults.NODE_TIMED_OUT)
        if timed_out or stopped:
            # The `node` frames, the next nodes' jobs, the workflow run's closing frames.
            await self.outbox.dispatch_xact(xact)
        return {"nodes_timed_out": timed_out, "node_runs_stopped": stopped}
