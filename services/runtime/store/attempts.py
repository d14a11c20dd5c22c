"""The executor's queries: claim a run, keep its lease, close its attempt.

Every write is fenced by the attempt's generation: an attempt that lost its lease can
change nothing. An attempt's closing transitions take `close_seq`, the attempt's next
frame seq (the frames the transition implies, `error` and `done`, follow the attempt's
own), and `trace_parent_of_implied`, the span that decided the transition (the parent of
what it implies in the run's trace).
"""

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from runwire.contracts.errors import ErrorBody
from runwire.contracts.status import RunStatus
from runwire.runtime.errors import CANCELED_ERROR, LostRace, StoreError
from runwire.runtime.store.batching import Batcher
from runwire.runtime.store.queries import Queries
from runwire.runtime.store.rows import BudgetGrant, Effect, Run, runs_told
from runwire.runtime.store.schema import QUERIES

CANCELED_BODY = CANCELED_ERROR.model_dump(mode="json")
# A claim as asked: run id, generation, owner, lease (ms), job ack subject, presence key.
_ClaimOf = tuple[uuid.UUID, int, str, int, str | None, int | None]
# A finish as asked: run id, generation, result, text, actor, close seq, the span
# that decided it.
_FinishOf = tuple[uuid.UUID, int, dict[str, Any], str, str, int, str | None]


@dataclass(frozen=True, slots=True)
class Claim:
    """A claim's outcome: the claimed effect; or None when its version or the run moved
    on; or the effect unchanged with `fresh` false (the run's authorization is stale:
    its tenant's policy changed since it was submitted) or `permitted` false (the run or
    its tenant's policy does not allow the effect's kind; `tenant_permits` false: its
    tenant's policy does not, or the tenant has none, which allows no kind)."""

    effect: Effect | None
    fresh: bool = True
    permitted: bool = True
    tenant_permits: bool = True

    @property
    def claimed(self) -> bool:
        return self.effect is not None and self.fresh and self.permitted


class ExecutorQueries(Queries):
    """Attempts as the executor runs them."""

    # The lease renewals and cancel polls of this process's attempts, batched (made on
    # first use, in the event loop that uses them).
    _heartbeats: "Batcher[tuple[uuid.UUID, int, int, str], bool | None] | None" = None
    _cancel_polls: "Batcher[tuple[uuid.UUID, int], bool | None] | None" = None
    _claims: "Batcher[_ClaimOf, Run | StoreError | None] | None" = None
    _finishes: "Batcher[_FinishOf, Run | StoreError | None] | None" = None

    async def effect_prepare(
        self,
        run_id: str,
        generation: int,
        *,
        key: str,
        kind: str,
        idempotency_key: str,
        request: dict[str, Any],
        digest: str,
        tokens: int = 0,
        cost: int = 0,
    ) -> Effect | BudgetGrant:
        """The effect under `key`: prepared now, or as an earlier attempt left it. An
        effect that reserves budget (`tokens`, `cost`) is prepared with its reservation
        in one transaction; the refused grant when it does not fit. LostRace when this
        attempt no longer holds the run."""
        run = uuid.UUID(run_id)
        args = (run, key, kind, idempotency_key, request, digest, generation, tokens, cost)
        if tokens <= 0 and cost <= 0:
            rec = await self._fetchrow("effect_prepare", *args)
        else:
            rec = await self._fetchrow("effect_get", run, key)
            if rec is None:
                async with self._transaction("effect_prepare") as conn:
                    grant_rec = await conn.fetchrow(
                        QUERIES["budget_reserve"], run, f"effect:{key}", tokens, cost, generation
                    )
                    if grant_rec is not None:
                        grant = BudgetGrant.from_record(grant_rec)
                        if not grant.granted:
                            return grant
                        rec = await conn.fetchrow(QUERIES["effect_prepare"], *args)
        if rec is None:
            raise LostRace(f"run {run_id} is no longer held by generation {generation}")
        return Effect.from_record(rec)

    async def effect_claim(
        self, run_id: str, key: str, version: int, generation: int, timeout_ms: int, kind: str
    ) -> "Claim":
        """Claim the effect for a dispatch (see `Claim`)."""
        rec = await self._fetchrow(
            "effect_claim", uuid.UUID(run_id), key, version, generation, timeout_ms, kind
        )
        if rec is None:
            return Claim(None)
        return Claim(
            Effect.from_record(rec),
            bool(rec["fresh"]),
            bool(rec["permitted"]),
            bool(rec["tenant_permits"]),
        )

    async def effect_settle(
        self,
        run_id: str,
        key: str,
        version: int,
        state: str,
        receipt: dict[str, Any] | None = None,
        error: str | None = None,
        error_code: str | None = None,
    ) -> Effect | None:
        """Move the effect to `state` if it is still at `version`; None otherwise."""
        rec = await self._fetchrow(
            "effect_settle", uuid.UUID(run_id), key, version, state, receipt, error, error_code
        )
        return Effect.from_record(rec) if rec else None

    async def ended_effects(self, kinds: Sequence[str], limit: int, every_ms: int) -> list[Effect]:
        """Effects of ended runs left `unknown` (or `claimed` past their deadline), of
        `kinds`, not checked in the last `every_ms`: marked checked now."""
        rows = await self._fetch("ended_effects", list(kinds), limit, every_ms)
        return [Effect.from_record(r) for r in rows]

    async def settle_ended_effect(
        self,
        effect: Effect,
        state: str,
        *,
        receipt: dict[str, Any] | None = None,
        error: str | None = None,
        error_code: str | None = None,
        actor: str,
    ) -> bool:
        """Move an effect of an ended run to `state` (a run event by `actor`); False when
        it moved meanwhile."""
        rec = await self._fetchrow(
            "settle_ended_effect",
            uuid.UUID(effect.run_id),
            effect.key,
            effect.version,
            state,
            receipt,
            error,
            error_code,
            actor,
        )
        return rec is not None

    async def budget_reserve(
        self, run_id: str, key: str, tokens: int, cost: int, generation: int
    ) -> BudgetGrant:
        """Reserve `tokens` and `cost` units for the run's call `key`. LostRace when the
        attempt no longer holds the run."""
        rec = await self._fetchrow(
            "budget_reserve", uuid.UUID(run_id), key, tokens, cost, generation
        )
        if rec is None:
            raise LostRace(f"run {run_id} is no longer held by generation {generation}")
        return BudgetGrant.from_record(rec)

    async def budget_settle(
        self, run_id: str, key: str, used: int, receipt: str | None, cost_used: int = 0
    ) -> bool:
        """Settle the reservation `key` with what the call used; False when it was
        settled (or released) already."""
        rows = await self._fetch("budget_settle", uuid.UUID(run_id), key, used, receipt, cost_used)
        return bool(rows)

    async def pin_config(self, run_id: str, generation: int, pin: str) -> None:
        """Pin the run's configuration, if nothing is pinned yet (fenced by generation)."""
        await self._fetch("pin_config", uuid.UUID(run_id), generation, pin)

    async def register_runners(self, schemas: dict[str, dict[str, Any] | None], owner: str) -> None:
        """Record that `owner` serves these runners (name → input JSON Schema or None)."""
        for name, schema in schemas.items():
            await self._fetch("register_runner", name, schema, owner)

    async def claim(
        self,
        run_id: str,
        generation: int,
        owner: str,
        lease_ms: int,
        job_ack: str | None = None,
        presence: int | None = None,
    ) -> Run | None:
        """Start an attempt; None when this job is stale, not due, canceled or timed out.

        `job_ack` is the job message's acknowledgement subject, kept so that recovery can
        release the job at once if this executor dies; `presence`, the key of the
        executor's presence lock, by which recovery notices at once that it died."""
        if self._claims is None:
            self._claims = Batcher(self._claim_many)
        found = await self._claims(
            (uuid.UUID(run_id), generation, owner, lease_ms, job_ack, presence)
        )
        if isinstance(found, StoreError):
            raise found
        return found

    async def _claim_many(self, claims: list[_ClaimOf]) -> list[Run | StoreError | None]:
        """The claims asked for at the same moment, as one statement for each owner (an
        executor is one owner); by run id, the order of every write of several runs."""
        found: dict[tuple[uuid.UUID, int], Run | StoreError] = {}
        by_owner: dict[tuple[str, int, int | None], list[_ClaimOf]] = {}
        for claim in sorted(claims, key=lambda c: c[0]):
            by_owner.setdefault((claim[2], claim[3], claim[5]), []).append(claim)
        for (owner, lease_ms, presence), group in by_owner.items():
            try:
                rows = await self._fetch(
                    "claim_runs",
                    [c[0] for c in group],
                    [c[1] for c in group],
                    owner,
                    lease_ms,
                    [c[4] for c in group],
                    presence,
                )
            except StoreError:
                if len(group) == 1:
                    raise
                await self._each_alone("claim_run", group, found)
                continue
            for rec in rows:
                run = Run.from_record(rec)
                found[(uuid.UUID(run.run_id), run.generation - 1)] = run  # claimed: +1
        # One claim of a run's generation starts its attempt: a repeat of the job in the
        # same batch (a redelivery) gets None, as a later claim would.
        return [found.pop((c[0], c[1]), None) for c in claims]

    async def _each_alone(
        self,
        name: str,
        items: Sequence[tuple[Any, ...]],
        found: dict[tuple[uuid.UUID, int], Run | StoreError],
    ) -> None:
        """After a batch failed because of one run's fault (Postgres itself answered):
        each item's own statement `name` (whose parameters are the item: run id and
        generation first), so that only the faulty run's fails."""
        for item in items:
            try:
                rec = await self._fetchrow(name, *item)
            except StoreError as exc:
                found[(item[0], item[1])] = exc
                continue
            if rec is not None:
                found[(item[0], item[1])] = Run.from_record(rec)

    async def heartbeat(
        self, run_id: str, generation: int, lease_ms: int, partial_text: str
    ) -> bool:
        """Renew the lease; returns whether a cancel was requested. LostRace if fenced out.
        The renewals of the attempts that ask at the same moment go as one statement."""
        if self._heartbeats is None:
            self._heartbeats = Batcher(self._heartbeat_many)
        found = await self._heartbeats((uuid.UUID(run_id), generation, lease_ms, partial_text))
        if found is None:
            raise LostRace(f"attempt {generation} of run {run_id} lost its lease", run_id=run_id)
        return found

    async def _heartbeat_many(
        self, leases: list[tuple[uuid.UUID, int, int, str]]
    ) -> list[bool | None]:
        rows = await self._fetch("heartbeat_many", *map(list, zip(*leases, strict=True)))
        cancels = {(r["run_id"], r["generation"]): bool(r["cancel_requested"]) for r in rows}
        return [cancels.get((run_id, generation)) for run_id, generation, _, _ in leases]

    async def cancel_requested(self, run_id: str, generation: int) -> bool:
        """Whether a cancel was requested; LostRace if the attempt was fenced out. The polls
        of the attempts that ask at the same moment go as one query."""
        if self._cancel_polls is None:
            self._cancel_polls = Batcher(self._cancel_requested_many)
        found = await self._cancel_polls((uuid.UUID(run_id), generation))
        if found is None:
            raise LostRace(f"attempt {generation} of run {run_id} lost its lease", run_id=run_id)
        return found

    async def _cancel_requested_many(
        self, attempts: list[tuple[uuid.UUID, int]]
    ) -> list[bool | None]:
        rows = await self._fetch("cancel_requested_many", *map(list, zip(*attempts, strict=True)))
        cancels = {(r["run_id"], r["generation"]): bool(r["cancel_requested"]) for r in rows}
        return [cancels.get(attempt) for attempt in attempts]

    async def save_checkpoint(
        self, run_id: str, generation: int, state: Any, partial_text: str
    ) -> int:
        rec = await self._fetchrow(
            "save_checkpoint", uuid.UUID(run_id), generation, state, partial_text
        )
        if rec is None:
            raise LostRace(f"attempt {generation} of run {run_id} lost its lease", run_id=run_id)
        return int(rec["checkpoint_version"])

    # An attempt's closing transitions take `close_seq`, the attempt's next frame seq: the
    # frames the transition implies (`error`, `done`) follow the attempt's own. And
    # `trace_parent_of_implied`: the span that decided the transition, parent of what it
    # implies in the run's trace.
    async def finish(
        self,
        run_id: str,
        generation: int,
        result: dict[str, Any],
        partial_text: str,
        actor: str,
        close_seq: int,
        trace_parent_of_implied: str | None = None,
    ) -> Run:
        """The attempt's run finished with `result`. The finishes asked for at the same
        moment go as one statement (by run id), each as if alone."""
        if self._finishes is None:
            self._finishes = Batcher(self._finish_many)
        finished = await self._finishes(
            (
                uuid.UUID(run_id),
                generation,
                result,
                partial_text,
                actor,
                close_seq,
                trace_parent_of_implied,
            )
        )
        if isinstance(finished, StoreError):
            raise finished
        if finished is None:
            raise LostRace(f"finish_run of run {run_id} lost its guard", run_id=run_id)
        return finished

    async def _finish_many(self, finishes: list[_FinishOf]) -> list[Run | StoreError | None]:
        found: dict[tuple[uuid.UUID, int], Run | StoreError] = {}
        by_actor: dict[str, list[_FinishOf]] = {}
        for finish in sorted(finishes, key=lambda f: f[0]):
            by_actor.setdefault(finish[4], []).append(finish)
        for actor, group in by_actor.items():
            try:
                rows = await self._fetch(
                    "finish_runs_told",
                    [f[0] for f in group],
                    [f[1] for f in group],
                    [json.dumps(f[2]) for f in group],
                    [f[3] for f in group],
                    actor,
                    [f[5] for f in group],
                    [f[6] for f in group],
                )
            except StoreError:
                if len(group) == 1:
                    raise
                await self._each_alone("finish_run", group, found)
                continue
            for run in runs_told(rows):
                found[(uuid.UUID(run.run_id), run.generation)] = run
        return [found.pop((f[0], f[1]), None) for f in finishes]

    async def close_attempt(
        self,
        run_id: str,
        generation: int,
        status: RunStatus,
        error: ErrorBody,
        partial_text: str,
        actor: str,
        close_seq: int,
        trace_parent_of_implied: str | None = None,
    ) -> Run:
        return await self._transition(
            "close_attempt",
            run_id,
            generation,
            status.value,
            error.model_dump(mode="json"),
            partial_text,
            actor,
            close_seq,
            trace_parent_of_implied,
        )

    async def cancel_attempt(
        self,
        run_id: str,
        generation: int,
        error: ErrorBody,
        partial_text: str,
        actor: str,
        close_seq: int,
        trace_parent_of_implied: str | None = None,
    ) -> Run:
        """Close a running attempt as canceled, with the error its canceller chose
        (`error` when none was recorded)."""
        return await self._transition(
            "cancel_attempt",
            run_id,
            generation,
            error.model_dump(mode="json"),
            partial_text,
            actor,
            close_seq,
            trace_parent_of_implied,
        )

    async def requeue(
        self,
        run_id: str,
        generation: int,
        error: ErrorBody,
        partial_text: str,
        delay_ms: int,
        actor: str,
        close_seq: int,
        trace_parent_of_implied: str | None = None,
    ) -> Run:
        """Back to the queue after `delay_ms` (its job is published once due), or
        canceled if a cancel arrived while the attempt was ending. `trace_parent_of_implied`:
        the span that decided the retry, parent of the next attempt."""
        return await self._transition(
            "requeue_run",
            run_id,
            generation,
            error.model_dump(mode="json"),
            partial_text,
            delay_ms,
            actor,
            CANCELED_BODY,
            close_seq,
            trace_parent_of_implied,
        )

    async def hand_back(
        self,
        run_id: str,
        generation: int,
        partial_text: str,
        actor: str,
        close_seq: int,
        trace_parent_of_implied: str | None = None,
    ) -> Run:
        """Back to the queue, not counted (shutdown), or canceled if one was asked."""
        return await self._transition(
            "hand_back_run",
            run_id,
            generation,
            partial_text,
            actor,
            CANCELED_BODY,
            close_seq,
            trace_parent_of_implied,
        )
