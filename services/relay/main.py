"""Start the relay: `runwire-relay` or `python -m services.relay`."""

import asyncio

from contracts.subjects import Subjects
from services.relay.join import Joiner
from services.relay.pipeline import Pipeline
from services.runtime.broker import Broker, StreamLimits
from services.runtime.commands import CommandServer
from services.runtime.health import serve_health
from services.runtime.lifecycle import run_service
from services.runtime.settings import RelaySettings
from services.runtime.store import Store

QUEUE_GROUP = "relay"


async def serve(settings: RelaySettings, stop: asyncio.Event) -> None:
    """Relay frames and answer joins until `stop` is set."""
    store = await Store.connect(settings.database_url, pool_size=settings.db_pool_size)
    broker = await Broker.connect(
        settings.nats_url, Subjects(settings.prefix), name="runwire-relay"
    )
    try:
        await broker.ensure_streams(StreamLimits.of(settings))
        server = CommandServer(broker, QUEUE_GROUP)
        await server.serve("join", Joiner(settings, store, broker).join)
        await serve_health(broker, store, "relay")
        await Pipeline(settings, store, broker).run(stop)
        await server.drain()
    finally:
        await broker.close()
        await store.close()


def main() -> None:
    settings = RelaySettings()
    run_service("relay", settings, lambda stop: serve(settings, stop))
