"""Health of a service, answered on `<prefix>.health.<service>` (request/reply)."""

from typing import Literal

from runwire.contracts.base import Versioned


class HealthReply(Versioned):
    """A replica's version, uptime and the state of what it depends on."""

    ok: bool
    service: str
    instance: str
    version: str
    uptime_s: float
    dependencies: dict[str, Literal["ok", "unavailable"]]
