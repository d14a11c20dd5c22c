"""An attempt's calls under rate limits (`ctx.take_rate`, `settle_rate`,
`observe_rate`): grants in Postgres, shared by every executor (see
sql/functions/rate_limits.sql). A call without room ends the attempt, and the run waits
in the queue until room comes, holding no slot."""

import logging
import math
from datetime import datetime

from runwire.runners.base import RateLimited, RunnerError
from runwire.runtime.logs import fields
from runwire.runtime.metrics import RATE_LIMITED
from runwire.runtime.outbox import Outbox
from runwire.runtime.store import Store

log = logging.getLogger(__name__)

# The longest a provider's word holds every call under a limit (a 429's Retry-After, a
# reset time).
MAX_PROVIDER_WAIT_S = 300.0
# What a runner may say of a provider's limits (see AttemptContext.observe_rate).
SAID = frozenset(
    {
        "retry_after_s",
        "tokens_left",
        "tokens_limit",
        "tokens_reset_s",
        "requests_left",
        "requests_limit",
        "requests_reset_s",
    }
)


class AttemptRates:
    """The rate-limited calls of one attempt of a run."""

    def __init__(self, store: Store, outbox: Outbox | None, run_id: str, owner: str) -> None:
        self._store = store
        self._outbox = outbox
        self._run_id = run_id
        self._owner = owner
        # Once a call had no room: until when the run waits, and under which limit.
        self.waiting: tuple[datetime, str] | None = None
        # The calls granted under a limit: only theirs are settled (a call under no
        # limit costs no second query).
        self._granted: set[str] = set()

    async def take(self, limits: list[str], call: str, tokens: int) -> bool:
        if self.waiting is not None:
            raise RateLimited(f"the attempt already ends to wait under {self.waiting[1]}")
        grant = await self._store.rate_reserve(limits, self._run_id, call, tokens, self._owner)
        if grant.served is not None and self._outbox is not None:
            # Runs that waited under the limits got their room: their jobs, at once.
            await self._outbox.dispatch_xact(grant.served)
        if grant.granted:
            if grant.limited:
                self._granted.add(call)
            return grant.limited
        if grant.at is None:
            raise RunnerError(
                f"the model call needs {tokens} tokens, more than rate limit {grant.key} "
                "allows in a minute",
                retryable=False,
            )
        assert grant.key is not None
        self.waiting = (grant.at, grant.key)
        RATE_LIMITED.labels(grant.key).inc()
        log.info(
            "model call waits for room under a rate limit",
            extra=fields(limit=grant.key, until=grant.at.isoformat()),
        )
        raise RateLimited(f"no room under rate limit {grant.key} before {grant.at.isoformat()}")

    async def settle(self, call: str, tokens: int) -> None:
        if call not in self._granted:
            return
        self._granted.discard(call)
        xact = await self._store.rate_settle(self._run_id, call, tokens, self._owner)
        if xact is not None and self._outbox is not None:
            # Runs that waited under the limit got their room: their jobs, at once.
            await self._outbox.dispatch_xact(xact)

    async def observe(self, limits: list[str], said: dict[str, float]) -> None:
        known = {k: _bounded(k, v) for k, v in said.items() if k in SAID}
        if known:
            await self._store.rate_observe(limits, known)


def _bounded(name: str, value: float) -> float:
    """What a runner says of a provider, kept within sense: no count below zero, no wait
    longer than MAX_PROVIDER_WAIT_S (a runner's mistake, or a tenant's runner in a process
    of its own, must not hold every tenant's calls for longer)."""
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise RunnerError(f"{name} must be a finite number, not negative", retryable=False)
    return min(value, MAX_PROVIDER_WAIT_S) if name.endswith("_s") else value
