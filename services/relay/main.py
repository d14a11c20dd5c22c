"""The relay as a FastStream application: `faststream run runwire.relay.main:app`,
`runwire-relay` or `python -m runwire.relay`.

`join` is a FastStream command. The archiver's consumer of the frames stream stays our
own code (`runwire.relay.archive`): it runs only while the relay holds the archive's
Postgres advisory lock, is reconciled from settings and re-declared when deleted, and
fetches in batches that are acknowledged once their segments are written; a FastStream
subscriber is declared once and runs for the life of the application, and settles
messages one at a time.
"""

import asyncio

from runwire.contracts.commands import JoinCommand
from runwire.contracts.replies import JoinReply
from runwire.relay.archive import Archiver
from runwire.relay.join import Joiner
from runwire.runtime import publications
from runwire.runtime.app import Service
from runwire.runtime.commands import Commands, tenant
from runwire.runtime.health import serve_health
from runwire.runtime.lifecycle import run
from runwire.runtime.settings import RelaySettings, from_env

QUEUE_GROUP = "relay"
JOIN_MAX_BYTES = 64 * 1024


class RelayService(Service[RelaySettings]):
    """Archives the frames stream into Postgres segments (one relay at a time) and
    answers `join` in the `relay` queue group (every relay)."""

    name = "relay"
    joiner: Joiner

    def __init__(self, settings: RelaySettings, *, own_process: bool = True) -> None:
        super().__init__(settings, own_process=own_process)
        command = Commands(self, QUEUE_GROUP)

        @command("join", max_bytes=JOIN_MAX_BYTES)
        async def join(body: JoinCommand) -> JoinReply:
            """Join a run's frames: every frame with `seq > after` known so far, and where
            live frames continue (`live`: stream, subject and stream sequence to consume
            from; null once the run has ended and `replay` is complete)."""
            return await self.joiner.join(tenant(), body)

        serve_health(self)
        publications.client_frames(self)

    def opened(self) -> None:
        self.joiner = Joiner(self.settings, self.store, self.broker)

    async def work(self, stop: asyncio.Event) -> None:
        await Archiver(self.settings, self.store, self.broker).run(stop)


service = RelayService(from_env(RelaySettings))
app = service.app


async def serve(settings: RelaySettings, stop: asyncio.Event) -> None:
    """Archive frames and answer joins in this process until `stop` is set."""
    await RelayService(settings, own_process=False).serve(stop)


def main() -> None:
    run(service)
