"""Wait timeouts: a wait of a waiting run (`ctx.interrupt`, `ctx.wait_for_signal`) past
its timeout is decided `timed_out`, once (an answer racing it either came first or is
refused NOT_WAITING), and its run queued for the next attempt, in which the runner's
wait raises WaitTimeout."""

import logging

from runwire.recovery.decisions import ACTOR, decision_span
from runwire.runtime import faults
from runwire.runtime.outbox import Outbox
from runwire.runtime.settings import RecoverySettings
from runwire.runtime.store import Store

log = logging.getLogger(__name__)


class WaitTimeouts:
    """The duty that ends the waits that ran past their timeout."""

    name = "wait timeouts"

    def __init__(self, settings: RecoverySettings, store: Store, outbox: Outbox) -> None:
        self.settings = settings
        self.store = store
        self.outbox = outbox

    async def run(self) -> dict[str, int]:
        runs = await self.store.time_out_waits(self.settings.batch_size, ACTOR)
        for run in runs:
            with decision_span(run, "wait timeout"):
                log.info("a wait of the run timed out: its next attempt is queued")
        if runs:
            await faults.point(faults.WAIT_TIMED_OUT)
        await self.outbox.dispatch(*runs)
        return {"waits_timed_out": len(runs)}
