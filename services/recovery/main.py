"""Start the recovery service: `runwire-recovery` or `python -m services.recovery`."""

import asyncio
import contextlib
import logging

from contracts.subjects import Subjects
from services.recovery.outbox import BATCH as OUTBOX_BATCH
from services.recovery.outbox import EventPublisher
from services.recovery.sweep import Sweeper
from services.runtime.broker import Broker, StreamLimits
from services.runtime.errors import RunwireError
from services.runtime.health import serve_health
from services.runtime.lifecycle import run_service
from services.runtime.logs import fields
from services.runtime.settings import RecoverySettings
from services.runtime.store import Store

log = logging.getLogger(__name__)

STREAM_CHECK_S = 5.0


async def serve(settings: RecoverySettings, stop: asyncio.Event) -> None:
    """Tick every `recovery_interval_ms` until `stop` is set."""
    store = await Store.connect(settings.database_url, pool_size=settings.db_pool_size)
    broker = await Broker.connect(
        settings.nats_url, Subjects(settings.prefix), name="runwire-recovery"
    )
    try:
        await broker.ensure_streams(StreamLimits.of(settings))
        await serve_health(broker, store, "recovery")
        sweeper = Sweeper(settings, store, broker)
        events = asyncio.create_task(_publish_events(settings, EventPublisher(store, broker), stop))
        loop = asyncio.get_running_loop()
        streams_checked = loop.time()
        while not stop.is_set():
            try:
                if loop.time() - streams_checked > STREAM_CHECK_S:
                    # A stream deleted on the server comes back, so lost jobs can be re-published.
                    streams_checked = loop.time()
                    await broker.ensure_streams(StreamLimits.of(settings))
                report = await sweeper.tick()
                if report.any():
                    log.info("recovery tick", extra=fields(**vars(report)))
            except RunwireError as exc:
                log.warning("recovery tick failed: %s", exc.message)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), settings.recovery_interval_ms / 1000)
        await events
    finally:
        await broker.close()
        await store.close()


async def _publish_events(
    settings: RecoverySettings, publisher: EventPublisher, stop: asyncio.Event
) -> None:
    """Publish run events every `events_interval_ms` (more often while there is a backlog)."""
    while not stop.is_set():
        published = 0
        try:
            published = await publisher.publish_pending()
        except RunwireError as exc:
            log.warning("run events not published: %s", exc.message)
        if published < OUTBOX_BATCH:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), settings.events_interval_ms / 1000)


def main() -> None:
    settings = RecoverySettings()
    run_service("recovery", settings, lambda stop: serve(settings, stop))
