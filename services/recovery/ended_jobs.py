"""Jobs of ended runs that no executor will take: removed from the jobs stream.

A job stays in the work-queue jobs stream until an executor of its runner acknowledges
it (one that finds its run ended acknowledges it at once). Under a runner no executor
serves, nobody ever does: the job of a run canceled while it was queued, or of one that
recovery failed before a crash let it remove the job (see `queue_timeouts.py`), would
hold a place of the queue for good. Looked for once every `republish_after_ms`.
"""

import logging
import time

from runwire.runtime.broker import Broker
from runwire.runtime.errors import RunwireError
from runwire.runtime.settings import RecoverySettings
from runwire.runtime.store import Store

log = logging.getLogger(__name__)


class EndedJobs:
    """The duty that removes jobs of ended runs under runners no executor serves."""

    name = "ended jobs"

    def __init__(self, settings: RecoverySettings, store: Store, broker: Broker) -> None:
        self.settings = settings
        self.store = store
        self.broker = broker
        self._next = 0.0

    async def run(self) -> dict[str, int]:
        now = time.monotonic()
        if now < self._next:
            return {"removed": 0}
        self._next = now + self.settings.republish_after_ms / 1000
        served = await self.broker.served_runners()
        jobs = await self.broker.jobs_by_run() if served is not None else None
        if served is None or jobs is None:
            return {"removed": 0}  # not known now: looked at again next time
        unserved = [run_id for run_id, runner in jobs.items() if runner not in served]
        removed = 0
        for start in range(0, len(unserved), self.settings.batch_size):
            batch = unserved[start : start + self.settings.batch_size]
            for run_id in await self.store.settled_runs(batch):
                try:
                    await self.broker.drop_job(jobs[run_id], run_id)
                except RunwireError as exc:
                    log.warning("the job of run %s stays in the jobs stream: %s", run_id, exc)
                    continue
                removed += 1
        if removed:
            log.info("removed %d jobs of ended runs that no executor would take", removed)
        return {"removed": removed}
