"""The recovery service as a FastStream application: `faststream run
services.recovery.main:app`, `runwire-recovery` or `python -m services.recovery`.

Its work is two timers (the sweep, the run-event outbox); FastStream serves its health.
"""

import asyncio
import contextlib
import logging

from services.recovery.outbox import BATCH as OUTBOX_BATCH
from services.recovery.outbox import EventPublisher
from services.recovery.sweep import Sweeper
from services.runtime import publications
from services.runtime.app import Service
from services.runtime.broker import StreamLimits
from services.runtime.errors import RunwireError
from services.runtime.health import serve_health
from services.runtime.lifecycle import run
from services.runtime.logs import fields
from services.runtime.settings import RecoverySettings

log = logging.getLogger(__name__)

STREAM_CHECK_S = 5.0


class RecoveryService(Service[RecoverySettings]):
    """Ticks every `recovery_interval_ms`; publishes run events every `events_interval_ms`."""

    name = "recovery"

    def __init__(self, settings: RecoverySettings, *, own_process: bool = True) -> None:
        super().__init__(settings, own_process=own_process)
        serve_health(self)
        publications.jobs(self)
        publications.raw_frames(self)
        publications.events(self)

    async def work(self, stop: asyncio.Event) -> None:
        settings, broker = self.settings, self.broker
        sweeper = Sweeper(settings, self.store, broker)
        events = asyncio.create_task(
            _publish_events(settings, EventPublisher(self.store, broker), stop)
        )
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


service = RecoveryService(RecoverySettings())
app = service.app


async def serve(settings: RecoverySettings, stop: asyncio.Event) -> None:
    """Recover runs in this process until `stop` is set."""
    await RecoveryService(settings, own_process=False).serve(stop)


def main() -> None:
    run(service)
