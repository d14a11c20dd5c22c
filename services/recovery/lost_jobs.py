"""Lost jobs: a run that waits for an attempt while its job is gone from the jobs stream
(the stream was deleted or purged) gets a new job. Postgres is the truth; losing the
whole jobs stream loses no run.

A run is looked at once every `republish_after_ms` while it waits. A job still waiting
in a long queue is not copied: the stream is listed once per look for the whole batch.
"""

import logging

from runwire.runtime.broker import Broker
from runwire.runtime.outbox import Outbox
from runwire.runtime.settings import RecoverySettings
from runwire.runtime.store import Store

log = logging.getLogger(__name__)


class LostJobs:
    """The duty that gives a new job to runs whose job is gone."""

    name = "lost jobs"

    def __init__(
        self, settings: RecoverySettings, store: Store, broker: Broker, outbox: Outbox
    ) -> None:
        self.settings = settings
        self.store = store
        self.broker = broker
        self.outbox = outbox

    async def run(self) -> dict[str, int]:
        stale = await self.store.stale_jobs(
            self.settings.republish_after_ms, self.settings.batch_size
        )
        if not stale:
            return {"reissued": 0}
        # One listing of the jobs stream for the whole batch, or, if it cannot be had,
        # one look per run.
        waiting = await self.broker.jobs_waiting()
        lost = [
            run_id
            for run_id, runner in stale.items()
            if not (
                run_id in waiting
                if waiting is not None
                else await self.broker.job_queued(runner, run_id)
            )
        ]
        if lost:
            log.warning("%d runs lost their job; queuing them again", len(lost))
            await self.outbox.dispatch_xact(await self.store.reissue_jobs(lost))
        return {"reissued": len(lost)}
