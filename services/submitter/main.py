"""Start the submitter: `runwire-submitter` or `python -m services.submitter`."""

import asyncio

from contracts.subjects import Subjects
from services.runtime.broker import Broker, StreamLimits
from services.runtime.commands import CommandServer
from services.runtime.health import serve_health
from services.runtime.lifecycle import run_service
from services.runtime.outbox import Outbox
from services.runtime.settings import SubmitterSettings
from services.runtime.store import Store
from services.submitter.commands import Submitter

QUEUE_GROUP = "submitter"


async def serve(settings: SubmitterSettings, stop: asyncio.Event) -> None:
    """Serve the submitter's commands until `stop` is set."""
    store = await Store.connect(settings.database_url, pool_size=settings.db_pool_size)
    broker = await Broker.connect(
        settings.nats_url, Subjects(settings.prefix), name="runwire-submitter"
    )
    try:
        await broker.ensure_streams(StreamLimits.of(settings))
        outbox = Outbox(store, broker)
        submitter = Submitter(settings, store, broker, outbox)
        server = CommandServer(broker, QUEUE_GROUP)
        await server.serve("submit", submitter.submit)
        await server.serve("get", submitter.get)
        await server.serve("cancel", submitter.cancel)
        await server.serve("abort_session", submitter.abort_session)
        await serve_health(broker, store, "submitter")
        await stop.wait()
        await server.drain()
        await outbox.close()
    finally:
        await broker.close()
        await store.close()


def main() -> None:
    settings = SubmitterSettings()
    run_service("submitter", settings, lambda stop: serve(settings, stop))
