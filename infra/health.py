"""Whether the local stack's services answer, asked the way a probe asks them.

supervisord calls a program RUNNING once it has stayed up for a second, which says
nothing about whether it has connected, migrated and subscribed: a command sent then
finds no service to answer it. A service answers its health request
(`<prefix>.health.<service>`, see `services/runtime/health.py`) only once it serves its
commands, so `runwire.infra.stack up` waits for a healthy answer from each service instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path

import nats
import nats.errors
from nats.aio.client import Client as NatsClient
from pydantic import ValidationError

from runwire.client.settings import server_urls, tls_context
from runwire.contracts.health import HealthReply
from runwire.contracts.subjects import Subjects

CONNECT_TIMEOUT_S = 5.0
# Replicas answer one request each: collect their answers this long.
REPLICAS_WINDOW_S = 0.3


@dataclass(frozen=True)
class Health:
    """What one health request to one service found."""

    service: str
    ok: bool
    # For a person: "answers", "no answer", "answers, but postgres unavailable", ...
    state: str


class HealthProbe:
    """One NATS connection that asks the services for their health."""

    def __init__(self, nc: NatsClient, subjects: Subjects) -> None:
        self.nc = nc
        self.subjects = subjects

    @classmethod
    async def connect(
        cls,
        nats_url: str,
        prefix: str,
        user: str | None = None,
        password: str | None = None,
        *,
        tls_ca: Path | None = None,
    ) -> HealthProbe:
        """Connect (as `user`, on a broker that enforces identities; with TLS, trusting
        `tls_ca`) to a NATS server that already accepts clients (check that first: the
        client tries a server that is down for minutes, whatever its options say)."""
        nc = await asyncio.wait_for(
            nats.connect(
                server_urls(nats_url),
                name="runwire-stack",
                user=user,
                password=password,
                tls=tls_context(tls_ca),
                connect_timeout=CONNECT_TIMEOUT_S,
                # A failed request already says the service did not answer; the client's
                # default handler would log a traceback per reconnect attempt.
                error_cb=_ignore,
            ),
            CONNECT_TIMEOUT_S,
        )
        return cls(nc, Subjects(prefix))

    async def close(self) -> None:
        """Close the connection."""
        await self.nc.close()

    async def ask_replicas(self, service: str, window: float = REPLICAS_WINDOW_S) -> list[Health]:
        """The health of every replica of `service` that answers within `window` (every
        replica answers one request)."""
        inbox = self.nc.new_inbox()
        sub = await self.nc.subscribe(inbox)
        found: list[Health] = []
        try:
            await self.nc.publish(self.subjects.health(service), b"{}", reply=inbox)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + window
            while (left := deadline - loop.time()) > 0:
                try:
                    msg = await sub.next_msg(timeout=left)
                except (nats.errors.TimeoutError, TimeoutError):
                    break
                if not msg.data and msg.headers and msg.headers.get("Status") == "503":
                    break  # no responders: no replica subscribes yet
                found.append(_health(service, msg.data))
        except nats.errors.Error as exc:
            found.append(Health(service, False, f"no answer (NATS: {exc or type(exc).__name__})"))
        finally:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
        return found


def _health(service: str, data: bytes) -> Health:
    try:
        reply = HealthReply.model_validate_json(data)
    except ValidationError:
        return Health(service, False, f"answers with something else: {data[:80]!r}")
    if reply.ok:
        return Health(service, True, "answers")
    down = [name for name, state in reply.dependencies.items() if state != "ok"]
    return Health(service, False, f"answers, but {', '.join(down)} unavailable")


async def _ignore(exc: Exception) -> None:
    return None
