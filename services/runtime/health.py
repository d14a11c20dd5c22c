"""Health requests: each replica answers `<prefix>.health.<service>` with its state.

A FastStream subscriber outside any queue group, so every replica answers (a caller
takes the first reply, or gathers them all); the request body is empty.
"""

import logging
import time
from typing import Any

from faststream import Context
from faststream.message import StreamMessage

from runwire.contracts.health import HealthReply
from runwire.contracts.subjects import is_inbox
from runwire.runtime import package_version
from runwire.runtime.app import Service
from runwire.runtime.errors import RunwireError

log = logging.getLogger(__name__)

# The request, as the health handler's one argument (the services' brokers inject
# nothing, so a handler takes one). A context field: the document shows an empty body.
REQUEST = Context("message")


async def _request(msg: StreamMessage[Any]) -> None:
    """A health request has no body; its reply goes only to an inbox. (Any identity may
    ask, and the reply subject is the asker's choice: a service must not publish for it
    anywhere else.)"""
    if msg.reply_to and not is_inbox(msg.reply_to):
        log.warning("health request with a reply subject outside any inbox: not answered")
        msg.reply_to = ""


def serve_health(service: Service[Any]) -> None:
    """Declare the health subscriber of `service` (it answers once the service runs)."""
    version = package_version()
    title = f"health.{service.name}"

    @service.faststream.subscriber(
        service.subjects.health(service.name), title=title, decoder=_request
    )
    async def health(_: Any = REQUEST) -> HealthReply:
        """Health of one replica: its version, uptime and the state of NATS and Postgres
        (the request body is empty; every replica answers)."""
        try:
            await service.store.ping()
            postgres = "ok"
        except RunwireError as exc:
            log.warning("health: Postgres unavailable: %s", exc.message)
            postgres = "unavailable"
        deps = {"nats": "ok", "postgres": postgres}
        return HealthReply(
            ok=all(v == "ok" for v in deps.values()),
            service=service.name,
            instance=service.instance,
            version=version,
            uptime_s=round(time.monotonic() - service.started, 3),
            dependencies=deps,
            runners=service.runner_names(),
            loaded=service.loaded_runners(),
        )

    service.faststream.replies[title] = (HealthReply,)
