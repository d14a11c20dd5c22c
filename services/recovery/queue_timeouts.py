"""Queue timeouts: a run that waited longer than its `queue_timeout_ms` for its first
attempt fails with QUEUE_TIMEOUT (its closing frames leave through the outbox)."""

import logging

from runwire.recovery.decisions import ACTOR, decision_span
from runwire.runtime.errors import QUEUE_TIMEOUT_ERROR
from runwire.runtime.outbox import Outbox
from runwire.runtime.settings import RecoverySettings
from runwire.runtime.store import Store

log = logging.getLogger(__name__)


class QueueTimeouts:
    """The duty that fails runs that waited too long for an attempt."""

    name = "queue timeouts"

    def __init__(self, settings: RecoverySettings, store: Store, outbox: Outbox) -> None:
        self.settings = settings
        self.store = store
        self.outbox = outbox

    async def run(self) -> dict[str, int]:
        runs = await self.store.expire_queue(
            limit=self.settings.batch_size, error=QUEUE_TIMEOUT_ERROR, actor=ACTOR
        )
        for run in runs:
            with decision_span(run, "queue timeout"):
                log.info("run failed: it waited longer than its queue timeout")
        await self.outbox.dispatch(*runs)
        return {"timed_out": len(runs)}
