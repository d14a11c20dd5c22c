"""Health of a service, answered on `<prefix>.health.<service>` (request/reply)."""

from typing import Literal

from pydantic import Field

from runwire.contracts.base import Versioned


class HealthReply(Versioned):
    """A replica's version, uptime and the state of what it depends on."""

    ok: bool
    service: str
    instance: str
    version: str
    uptime_s: float
    dependencies: dict[str, Literal["ok", "unavailable"]]
    # The runners this replica serves: an executor's take jobs of these runners only;
    # a submitter's are the runners it accepts runs for. Empty for the other services.
    runners: list[str] = Field(default_factory=list)
    # The runners this replica loaded from its own installation when it started (entry
    # points, RUNWIRE_RUNNERS): an executor's, once it takes their jobs, are `runners`; a
    # submitter also accepts runners only executors have. Empty for the other services.
    loaded: list[str] = Field(default_factory=list)
