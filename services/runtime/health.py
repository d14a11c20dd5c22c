"""Health requests: each service answers `<prefix>.health.<service>` with its state."""

import logging
import os
import socket
import time

from nats.aio.msg import Msg

from contracts.health import HealthReply
from services.runtime import package_version
from services.runtime.broker import Broker
from services.runtime.errors import RunwireError
from services.runtime.store import Store

log = logging.getLogger(__name__)


async def serve_health(broker: Broker, store: Store, service: str) -> None:
    """Answer health requests for this replica (every replica answers; the first wins)."""
    started = time.monotonic()
    instance = f"{socket.gethostname()}:{os.getpid()}"
    version = package_version()

    async def answer(msg: Msg) -> None:
        try:
            await store.ping()
            postgres = "ok"
        except RunwireError as exc:
            log.warning("health: Postgres unavailable: %s", exc.message)
            postgres = "unavailable"
        deps = {"nats": "ok", "postgres": postgres}
        reply = HealthReply(
            ok=all(v == "ok" for v in deps.values()),
            service=service,
            instance=instance,
            version=version,
            uptime_s=round(time.monotonic() - started, 3),
            dependencies=deps,
        )
        if msg.reply:
            await broker.nc.publish(msg.reply, reply.model_dump_json().encode())

    await broker.subscribe(broker.subjects.health(service), answer)
