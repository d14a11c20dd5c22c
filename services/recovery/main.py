"""Start the recovery service: `runwire-recovery` or `python -m services.recovery`.

Recovery is the suite's clock. Every `recovery_interval_ms` it runs its duties, each a
module of its own and each a guarded write with `FOR UPDATE SKIP LOCKED`, so any number
of replicas can run them at once without acting twice on a run: expired leases, queue
timeouts, session turns after a cancel's grace, lost jobs, retention. Every
`outbox_interval_ms` it sweeps the outbox (one replica at a time).
"""

import asyncio
import contextlib
import logging
from typing import Protocol

from contracts.subjects import Subjects
from services.recovery.leases import ExpiredLeases
from services.recovery.lost_jobs import LostJobs
from services.recovery.queue_timeouts import QueueTimeouts
from services.recovery.retention import Retention
from services.recovery.sessions import SessionTurns
from services.runtime.broker import Broker, StreamLimits
from services.runtime.errors import RunwireError
from services.runtime.health import serve_health
from services.runtime.lifecycle import run_service
from services.runtime.logs import fields
from services.runtime.metrics import QUEUE
from services.runtime.outbox import SWEEP_BATCH, Outbox
from services.runtime.settings import RecoverySettings
from services.runtime.store import Store

log = logging.getLogger(__name__)

STREAM_CHECK_S = 5.0


class Duty(Protocol):
    """One of recovery's duties: does its part of a tick, says what it did."""

    name: str

    async def run(self) -> dict[str, int]: ...


def duties(settings: RecoverySettings, store: Store, broker: Broker, outbox: Outbox) -> list[Duty]:
    """Recovery's duties, in the order a tick runs them."""
    return [
        ExpiredLeases(settings, store, broker, outbox),
        QueueTimeouts(settings, store, outbox),
        SessionTurns(settings, store),
        LostJobs(settings, store, broker, outbox),
        Retention(settings, store, broker),
    ]


async def tick(all_duties: list[Duty], store: Store) -> dict[str, int]:
    """Run every duty once; one that fails does not keep the others from their turn."""
    report: dict[str, int] = {}
    for duty in all_duties:
        try:
            report.update(await duty.run())
        except RunwireError as exc:
            log.warning("recovery duty %s failed, the next tick tries again: %s", duty.name, exc)
    # Measured after the tick's changes, so the gauges show what is left waiting.
    with contextlib.suppress(RunwireError):
        QUEUE.update(await store.queue_stats())
    return report


async def serve(settings: RecoverySettings, stop: asyncio.Event) -> None:
    """Tick every `recovery_interval_ms` and sweep the outbox until `stop` is set."""
    store = await Store.connect(settings.database_url, pool_size=settings.db_pool_size)
    broker = await Broker.connect(
        settings.nats_url, Subjects(settings.prefix), name="runwire-recovery"
    )
    outbox = Outbox(store, broker)
    try:
        await broker.ensure_streams(StreamLimits.of(settings))
        await serve_health(broker, store, "recovery")
        sweeping = asyncio.create_task(_sweep(settings, outbox, stop))
        all_duties = duties(settings, store, broker, outbox)
        loop = asyncio.get_running_loop()
        streams_checked = loop.time()
        while not stop.is_set():
            if loop.time() - streams_checked > STREAM_CHECK_S:
                # A stream deleted on the server comes back, so lost jobs can be queued again.
                streams_checked = loop.time()
                try:
                    await broker.ensure_streams(StreamLimits.of(settings))
                except RunwireError as exc:
                    log.warning("streams not checked: %s", exc.message)
            report = await tick(all_duties, store)
            if any(report.values()):
                log.info("recovery tick", extra=fields(**report))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), settings.recovery_interval_ms / 1000)
        await sweeping
    finally:
        await outbox.close()
        await broker.close()
        await store.close()


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


def main() -> None:
    settings = RecoverySettings()
    run_service("recovery", settings, lambda stop: serve(settings, stop))
