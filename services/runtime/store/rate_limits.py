"""Rate limits in requests and tokens per minute, shared by every executor: a model
call's grant, its settlement, what the provider said, and the operator's limits
(`sql/functions/rate_limits.sql`)."""

import uuid
from dataclasses import dataclass
from datetime import datetime

from runwire.runtime.store.attempts import CANCELED_BODY
from runwire.runtime.store.queries import Queries
from runwire.runtime.store.rows import Run


@dataclass(frozen=True, slots=True)
class RateGrant:
    """A call's grant: made, or the soonest time it may be (None: never, the call needs
    more than the limit) and the limit that holds it. `limited`: whether any of the
    limits asked for is set."""

    granted: bool
    limited: bool
    at: datetime | None = None
    key: str | None = None
    # The transaction's id when runs waiting under the limits got their room (their
    # jobs are in the outbox), else None.
    served: str | None = None


@dataclass(frozen=True, slots=True)
class RateLimit:
    """An operator's limit of a provider key or model, and what it holds now."""

    key: str
    rpm: int | None
    tpm: int | None
    requests: int
    tokens: int
    waiting: int


class RateLimitQueries(Queries):
    """Grants under rate limits (the executor), and the limits (the submitter)."""

    async def rate_reserve(
        self, keys: list[str], run_id: str, call: str, tokens: int, actor: str
    ) -> RateGrant:
        rec = await self._fetchrow(
            "rate_reserve", sorted(set(keys)), uuid.UUID(run_id), call, tokens, actor
        )
        assert rec is not None
        served = rec["xact"] if rec["o_served"] else None
        if rec["o_granted"]:
            return RateGrant(True, rec["o_limited"], served=served)
        return RateGrant(False, True, rec["o_at"], rec["o_key"], served)

    async def rate_settle(self, run_id: str, call: str, tokens: int, actor: str) -> str | None:
        """Settle a call's grant; the transaction's id when runs waiting under its limits
        got theirs (their jobs are in the outbox), else None."""
        rec = await self._fetchrow("rate_settle", uuid.UUID(run_id), call, tokens, actor)
        return rec["xact"] if rec is not None and rec["served"] else None

    async def rate_observe(self, keys: list[str], said: dict[str, float]) -> None:
        """What the provider said of the limits `keys` (see rate_observe)."""
        await self._fetch("rate_observe", keys, said)

    async def rate_wait(
        self,
        run_id: str,
        generation: int,
        until: datetime,
        key: str,
        partial_text: str,
        actor: str,
        close_seq: int,
        trace_parent_of_implied: str | None = None,
    ) -> Run:
        """Back to the queue until `until` (or sooner, when room comes), the attempt not
        counted; or canceled if a cancel arrived meanwhile."""
        return await self._transition(
            "rate_wait_run",
            run_id,
            generation,
            until,
            key,
            partial_text,
            actor,
            CANCELED_BODY,
            close_seq,
            trace_parent_of_implied,
        )

    async def set_rate_limit(self, key: str, rpm: int | None, tpm: int | None) -> None:
        await self._fetch("set_rate_limit", key, rpm, tpm)

    async def remove_rate_limit(self, key: str) -> bool:
        return bool(await self._fetch("remove_rate_limit", key))

    async def rate_limits(self) -> list[RateLimit]:
        return [
            RateLimit(r["key"], r["rpm"], r["tpm"], r["requests"], r["tokens"], r["waiting"])
            for r in await self._fetch("rate_limits")
        ]
