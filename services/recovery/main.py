"""The recovery service as a FastStream application: `faststream run
runwire.recovery.main:app`, `runwire-recovery` or `python -m runwire.recovery`.

Recovery is the suite's clock; FastStream serves its health. Every
`recovery_interval_ms` it runs its duties, each a module of its own and each a guarded
write with `FOR UPDATE SKIP LOCKED`, so any number of replicas can run them at once
without acting twice on a run: expired leases, queue timeouts, session turns after a
cancel's grace, lost jobs, jobs of ended runs nobody would take, retention. Every
`lease_watch_ms` it also looks for runs whose executor is gone (so they resume within a
fraction of a second), every `outbox_interval_ms` it sweeps the outbox (one replica at a
time), and it removes tenants' consumers that break the rules the broker cannot check
(`consumers.py`).
"""

import asyncio
import contextlib
import logging
from typing import Protocol

from runwire.recovery.budgets import OrphanedReservations
from runwire.recovery.consumers import TenantConsumers
from runwire.recovery.ended_jobs import EndedJobs
from runwire.recovery.leases import ExpiredLeases, PresenceWatch
from runwire.recovery.lost_jobs import LostJobs
from runwire.recovery.queue_timeouts import QueueTimeouts
from runwire.recovery.retention import Retention
from runwire.recovery.schedules import ScheduleFires
from runwire.recovery.sessions import SessionTurns
from runwire.recovery.wait_timeouts import WaitTimeouts
from runwire.recovery.webhooks import WebhookDeliveries
from runwire.recovery.workflows import WorkflowDeadlines
from runwire.runtime import publications
from runwire.runtime.app import Service
from runwire.runtime.broker import Broker
from runwire.runtime.errors import RunwireError
from runwire.runtime.health import serve_health
from runwire.runtime.lifecycle import run
from runwire.runtime.logs import fields
from runwire.runtime.metrics import QUEUE
from runwire.runtime.outbox import SWEEP_BATCH, Outbox
from runwire.runtime.settings import RecoverySettings, from_env
from runwire.runtime.store import Store
from runwire.runtime.streams import StreamLimits

log = logging.getLogger(__name__)

STREAM_CHECK_S = 5.0


class Duty(Protocol):
    """One of recovery's duties: does its part of a tick, says what it did."""

    name: str

    async def run(self) -> dict[str, int]: ...


def duties(
    settings: RecoverySettings,
    store: Store,
    broker: Broker,
    outbox: Outbox,
    presence: PresenceWatch,
) -> list[Duty]:
    """Recovery's duties, in the order a tick runs them."""
    return [
        ExpiredLeases(settings, store, broker, outbox, presence),
        QueueTimeouts(settings, store, broker, outbox),
        WaitTimeouts(settings, store, outbox),
        SessionTurns(settings, store),
        ScheduleFires(settings, store),
        WorkflowDeadlines(settings, store, outbox),
        LostJobs(settings, store, broker, outbox),
        EndedJobs(settings, store, broker),
        Retention(settings, store, broker),
        OrphanedReservations(store),
    ]


async def tick(
    all_duties: list[Duty], store: Store, *, count_waiting: bool = False
) -> dict[str, int]:
    """Run every duty once; one that fails does not keep the others from their turn;
    measure the queue's gauges (and, with `count_waiting`, the waiting runs')."""
    report: dict[str, int] = {}
    for duty in all_duties:
        try:
            report.update(await duty.run())
        except RunwireError as exc:
            log.warning("recovery duty %s failed, the next tick tries again: %s", duty.name, exc)
    # Measured after the tick's changes, so the gauges show what is left waiting.
    try:
        QUEUE.update(await store.queue_stats())
        if count_waiting:
            QUEUE.update_waiting(await store.waiting_stats())
    except RunwireError as exc:
        log.warning("queue gauges not measured, the next tick tries again: %s", exc.message)
    return report


class RecoveryService(Service[RecoverySettings]):
    """Runs its duties every `recovery_interval_ms`; sweeps the outbox every
    `outbox_interval_ms`."""

    name = "recovery"

    def __init__(self, settings: RecoverySettings, *, own_process: bool = True) -> None:
        super().__init__(settings, own_process=own_process)
        serve_health(self)
        publications.jobs(self)
        publications.frames_out(self)
        publications.events(self)

    async def work(self, stop: asyncio.Event) -> None:
        sweeping = asyncio.create_task(_sweep(self.settings, self.outbox, stop))
        policing = asyncio.create_task(TenantConsumers(self.settings, self.broker).watch(stop))
        delivering = asyncio.create_task(WebhookDeliveries(self.settings, self.store).run(stop))
        presence = PresenceWatch(self.settings.database_url, self.settings.presence_settle_ms)
        all_duties = duties(self.settings, self.store, self.broker, self.outbox, presence)
        leases = next(d for d in all_duties if isinstance(d, ExpiredLeases))
        watching = asyncio.create_task(_watch_leases(self.settings, leases, stop))
        try:
            await self._tick_until(stop, all_duties)
        finally:
            await presence.close()
            await watching
        await sweeping
        await policing
        await delivering

    async def _tick_until(self, stop: asyncio.Event, all_duties: list[Duty]) -> None:
        settings, broker = self.settings, self.broker
        loop = asyncio.get_running_loop()
        streams_checked = loop.time()
        waiting_counted = -float("inf")
        while not stop.is_set():
            if loop.time() - streams_checked > STREAM_CHECK_S:
                # A stream deleted on the server comes back, so lost jobs can be queued again.
                streams_checked = loop.time()
                try:
                    await broker.ensure_streams(StreamLimits.of(settings))
                except RunwireError as exc:
                    log.warning("streams not checked: %s", exc.message)
            every = settings.waiting_gauges_interval_ms / 1000
            count_waiting = loop.time() - waiting_counted >= every
            if count_waiting:
                waiting_counted = loop.time()
            report = await tick(all_duties, self.store, count_waiting=count_waiting)
            if any(report.values()):
                log.info("recovery tick", extra=fields(**report))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), settings.recovery_interval_ms / 1000)


async def _watch_leases(
    settings: RecoverySettings, leases: ExpiredLeases, stop: asyncio.Event
) -> None:
    """Between ticks, every `lease_watch_ms`: take over the runs of an executor that is
    gone, or whose lease ran out, without waiting for the next tick (the duty is safe to
    run beside the tick's: each run is taken over once)."""
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), settings.lease_watch_ms / 1000)
        if stop.is_set():
            return
        try:
            report = await leases.run()
        except RunwireError as exc:
            log.warning("leases not looked at: %s", exc.message)
            continue
        if any(report.values()):
            log.info("recovery lease watch", extra=fields(**report))


async def _sweep(settings: RecoverySettings, outbox: Outbox, stop: asyncio.Event) -> None:
    """Sweep the outbox every `outbox_interval_ms` (at once again while a backlog remains)."""
    while not stop.is_set():
        published = 0
        try:
            published = await outbox.sweep(settings.outbox_grace_ms, SWEEP_BATCH)
        except RunwireError as exc:
            log.warning("outbox not swept: %s", exc.message)
        if published < SWEEP_BATCH:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), settings.outbox_interval_ms / 1000)


service = RecoveryService(from_env(RecoverySettings))
app = service.app


async def serve(settings: RecoverySettings, stop: asyncio.Event) -> None:
    """Recover runs in this process until `stop` is set."""
    await RecoveryService(settings, own_process=False).serve(stop)


def main() -> None:
    run(service)
