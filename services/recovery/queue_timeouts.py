"""Queue timeouts: a run that waited longer than its `queue_timeout_ms` for its first
attempt fails with QUEUE_TIMEOUT (its closing frames leave through the outbox); so does
one that waited `unserved_timeout_ms` under a runner no executor serves, whatever its
queue timeout. The job of each leaves the jobs stream: a work-queue stream keeps a job
until an executor of its runner acknowledges it, and under a runner nobody serves none
ever would, each holding a place of the queue until every tenant got QUEUE_FULL."""

import logging

from runwire.recovery.decisions import ACTOR, decision_span
from runwire.runtime.broker import Broker
from runwire.runtime.errors import QUEUE_TIMEOUT_ERROR, UNSERVED_ERROR, RunwireError
from runwire.runtime.logs import fields
from runwire.runtime.outbox import Outbox
from runwire.runtime.settings import RecoverySettings
from runwire.runtime.store import Run, Store

log = logging.getLogger(__name__)


class QueueTimeouts:
    """The duty that fails runs that waited too long for an attempt."""

    name = "queue timeouts"

    def __init__(
        self, settings: RecoverySettings, store: Store, broker: Broker, outbox: Outbox
    ) -> None:
        self.settings = settings
        self.store = store
        self.broker = broker
        self.outbox = outbox

    async def run(self) -> dict[str, int]:
        runs = await self.store.expire_queue(
            limit=self.settings.batch_size, error=QUEUE_TIMEOUT_ERROR, actor=ACTOR
        )
        for run in runs:
            with decision_span(run, "queue timeout"):
                log.info("run failed: it waited longer than its queue timeout")
        unserved = await self._unserved()
        await self.outbox.dispatch(*runs, *unserved)
        for run in [*runs, *unserved]:
            try:
                await self.broker.drop_job(run.runner, run.run_id)
            except RunwireError as exc:
                # An executor of its runner, if one ever comes, acknowledges it then.
                log.warning("the job of run %s stays in the jobs stream: %s", run.run_id, exc)
        return {"timed_out": len(runs), "unserved": len(unserved)}

    async def _unserved(self) -> list[Run]:
        served = await self.broker.served_runners()
        if served is None:
            return []  # not known now: nothing is failed on a guess
        runs = await self.store.expire_unserved(
            limit=self.settings.batch_size,
            error=UNSERVED_ERROR,
            actor=ACTOR,
            after_ms=self.settings.unserved_timeout_ms,
            served=served,
        )
        for run in runs:
            with decision_span(run, "queue timeout"):
                log.warning(
                    "run failed: no executor serves its runner %r (it waited %d ms)",
                    run.runner,
                    self.settings.unserved_timeout_ms,
                    extra=fields(run_id=run.run_id, tenant=run.tenant),
                )
        return runs
