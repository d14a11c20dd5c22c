"""The submitter's queries: accept a run, cancel runs, fail a run the queue refused."""

import json
import uuid
from datetime import datetime
from typing import Any, NamedTuple

import asyncpg

from runwire.contracts.errors import ErrorBody
from runwire.runtime.errors import QueueFull, QuotaExceeded, RunwireError, StoreError
from runwire.runtime.settings import DEFAULT_SUPERSEDE_GRACE_MS
from runwire.runtime.store.batching import Batcher
from runwire.runtime.store.queries import Queries
from runwire.runtime.store.rows import Run, parse_run_id, runs_told
from runwire.runtime.store.schema import QUERIES


class _Submitted(NamedTuple):
    """insert_run's parameters, in its order."""

    run_id: uuid.UUID
    tenant: str
    request_id: str
    session_id: str | None
    multitask: str
    runner: str
    input: dict[str, Any]
    metadata: dict[str, Any]
    max_attempts: int
    attempt_timeout_ms: int
    queue_timeout_ms: int | None
    actor: str
    trace_parent: str | None
    config_pin: str | None
    budget_tokens: int | None
    budget_cost: int | None
    effects: list[str] | None
    workflow: dict[str, Any] | None
    priority: int
    concurrency_key: str | None
    not_before: datetime | None


# A submit whose input and metadata are larger goes in a statement of its own: a batch
# of a thousand stays a few MB.
BATCHED_INPUT_BYTES = 16 * 1024


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


class SubmitterQueries(Queries):
    """Runs as the submitter writes them."""

    _inserts: "Batcher[_Submitted, Run | RunwireError | None] | None" = None

    async def reschedule_run(
        self, tenant: str, run_id: str, not_before: datetime, actor: str
    ) -> str | None:
        """Move a run that waits without a job to start no earlier than `not_before`, and
        give its tenant's due runs their job (this one, if due and the share has room);
        the transaction whose outbox holds their jobs, or None when the run has its job
        already, has ended, or is not there."""
        key = parse_run_id(run_id)
        if key is None:
            return None
        async with self._transaction("reschedule_run") as conn:
            moved = await conn.fetchrow(QUERIES["reschedule_run"], tenant, key, not_before, actor)
            if moved is None:
                return None
            told = await conn.fetchrow(QUERIES["start_share_turn"], tenant, actor)
        assert told is not None
        return str(told["xact"])

    async def set_webhooks(
        self, tenant: str, endpoints: list[tuple[str, list[str]]], secret: str, rotate: bool
    ) -> str | None:
        """Replace the tenant's endpoints ((url, events) each); store `secret` as its
        signing secret when it has none or `rotate`: the secret when stored, else None."""
        async with self._transaction("set_webhooks") as conn:
            await conn.execute(
                QUERIES["set_webhook_endpoints"],
                tenant,
                [url for url, _ in endpoints],
                [json.dumps(events) for _, events in endpoints],
            )
            made = await conn.fetchrow(QUERIES["put_webhook_secret"], tenant, secret, rotate)
        return str(made["secret"]) if made else None

    async def webhooks_of(self, tenant: str, failed: int) -> dict[str, Any]:
        """The tenant's endpoints, its deliveries not made yet (`pending`), and its latest
        `failed` deliveries that failed for good."""
        rec = await self._fetchrow("webhooks_of", tenant, failed)
        assert rec is not None
        return dict(rec)

    async def set_schedule(self, tenant: str, schedule: dict[str, Any]) -> None:
        """Create or replace a schedule (the columns of `set_schedule`, by name)."""
        names = ("name", "cron", "tz", "runner", "input", "overlap", "catch_up_s", "paused")
        more = ("max_attempts", "attempt_timeout_ms", "next_fire_at")
        await self._fetch("set_schedule", tenant, *(schedule[n] for n in (*names, *more)))

    async def pause_schedules(self, tenant: str) -> None:
        """Pause every schedule of the tenant (an ended tenant starts no run)."""
        await self._fetch("pause_schedules", tenant)

    async def remove_schedule(self, tenant: str, name: str) -> bool:
        return bool(await self._fetch("remove_schedule", tenant, name))

    async def schedules_of(self, tenant: str, name: str | None = None) -> list[dict[str, Any]]:
        """The tenant's schedules (or the one named), by name."""
        return [dict(r) for r in await self._fetch("schedules_of", tenant, name)]

    async def backfill_schedule(
        self, tenant: str, name: str, fires: list[datetime], actor: str
    ) -> tuple[int, str]:
        """Make the runs of these fires of the schedule (each once): how many were made,
        and the transaction whose outbox holds their jobs."""
        rec = await self._fetchrow("backfill_schedule", tenant, name, fires, actor)
        assert rec is not None
        return int(rec["made"]), str(rec["xact"])

    async def queued_for(self, run_id: str) -> str | None:
        """What a queued run without a job waits for: `session`, `concurrency_key`,
        `share` (None: it has a job, or is not queued)."""
        rec = await self._fetchrow("queued_for", uuid.UUID(run_id))
        return rec["queued_for"] if rec else None

    async def run_budget(self, run_id: str) -> dict[str, Any] | None:
        """The run's budget and what its costly calls used and hold (None: no run)."""
        row = await self._fetchrow("run_budget", uuid.UUID(run_id))
        return dict(row) if row is not None else None

    async def run_effects(self, run_id: str) -> list[dict[str, Any]]:
        """The run's side effects: key, kind, state, receipt, error."""
        return [dict(r) for r in await self._fetch("run_effects", uuid.UUID(run_id))]

    async def resolve_effect(
        self,
        tenant: str,
        run_id: str,
        key: str,
        receipt: dict[str, Any] | None,
        error: str | None,
        actor: str,
    ) -> str | None:
        """Settle an unknown (or orphaned claimed) effect (a run event by `actor`); its
        new state, or None when no such effect of the tenant's run is unknown or claimed."""
        rec = await self._fetchrow(
            "resolve_effect", tenant, uuid.UUID(run_id), key, receipt, error, actor
        )
        return str(rec["state"]) if rec else None

    async def set_queue_defaults(
        self, share_runs: int, max_queued_runs: int, priority_max_wait_ms: int
    ) -> None:
        """The share of jobs and the queue capacity of a tenant the operator set none for,
        and how long a waiting run may be passed over by higher priorities."""
        await self._fetch("set_queue_defaults", share_runs, max_queued_runs, priority_max_wait_ms)

    async def set_tenant_budget(self, tenant: str, limits: dict[str, int | None]) -> None:
        """Set the limits named in `limits` (tokens, max_active_runs, max_runs_per_day,
        cost, share, max_queued_runs); the others keep their values."""
        names = (
            "tokens",
            "max_active_runs",
            "max_runs_per_day",
            "cost",
            "share",
            "max_queued_runs",
            "max_runs_per_key",
        )
        await self._fetch(
            "set_tenant_budget",
            tenant,
            *(limits.get(n) for n in names),
            [n in limits for n in names],
        )

    async def tenant_budget(self, tenant: str) -> dict[str, Any]:
        """The tenant's limits (None: none), what it spent (settled and reserved: tokens
        `spent`, `reserved`; cost units `cost_spent`, `cost_reserved`), its active runs
        and the runs it submitted today."""
        rec = await self._fetchrow("tenant_budget", tenant)
        assert rec is not None
        return dict(rec)

    async def set_tenant_policy(self, tenant: str, effects: list[str] | None) -> None:
        """Replace the tenant's policy (a new version: earlier runs' authorization is
        stale)."""
        await self._fetch("set_tenant_policy", tenant, effects)

    async def tenant_policy(self, tenant: str) -> tuple[list[str] | None, int]:
        """The tenant's permitted effect kinds (None: every kind; [] with version 0 when
        no policy was ever set: none) and policy version."""
        rec = await self._fetchrow("tenant_policy", tenant)
        assert rec is not None
        return (list(rec["effects"]) if rec["effects"] is not None else None), rec["version"]

    async def runner_catalog(self) -> dict[str, dict[str, Any] | None]:
        """Every runner an executor has served: name → input JSON Schema (or None)."""
        return {r["name"]: r["input_schema"] for r in await self._fetch("runner_catalog")}

    async def coalesce_into(
        self,
        tenant: str,
        session_id: str,
        runner: str,
        input: dict[str, Any],
        request_id: str,
        max_bytes: int,
    ) -> Run | None:
        """Add `input` to the session's last run when it is a coalesced run that has not
        started (see `coalesce_into`): that run, or None."""
        return await self._run_or_none(
            "coalesce_into", tenant, session_id, runner, json.dumps(input), request_id, max_bytes
        )

    async def session_active(self, tenant: str, session_id: str) -> list[str]:
        return [str(r["run_id"]) for r in await self._fetch("session_active", tenant, session_id)]

    async def insert_run(
        self,
        *,
        run_id: str,
        tenant: str,
        request_id: str,
        session_id: str | None,
        multitask: str,
        runner: str,
        input: dict[str, Any],
        metadata: dict[str, Any],
        max_attempts: int,
        attempt_timeout_ms: int,
        queue_timeout_ms: int | None,
        actor: str,
        trace_parent: str | None = None,
        config_pin: str | None = None,
        budget_tokens: int | None = None,
        budget_cost: int | None = None,
        effects: list[str] | None = None,
        workflow: dict[str, Any] | None = None,
        priority: int = 0,
        concurrency_key: str | None = None,
        not_before: datetime | None = None,
    ) -> Run | None:
        """Create a queued run; None when the tenant already has this request_id.
        `config_pin`: the fingerprint of the configuration its attempts must run with.

        The runs submitted at the same moment outside a session are inserted together,
        in one statement and one commit (a session's submit runs inside its lock's
        transaction, on its own)."""
        args = _Submitted(
            uuid.UUID(run_id),
            tenant,
            request_id,
            session_id,
            multitask,
            runner,
            input,
            metadata,
            max_attempts,
            attempt_timeout_ms,
            queue_timeout_ms,
            actor,
            trace_parent,
            config_pin,
            budget_tokens,
            budget_cost,
            effects,
            workflow,
            priority,
            concurrency_key,
            not_before,
        )
        if session_id is not None or not isinstance(self._pool, asyncpg.Pool):
            return await self._run_or_none("insert_run", *args)
        if self._inserts is None:
            self._inserts = Batcher(self._insert_many)
        found = await self._inserts(args)
        if isinstance(found, RunwireError):
            raise found
        return found

    async def _insert_many(self, items: list[_Submitted]) -> list[Run | RunwireError | None]:
        """The inserts asked for at the same moment: one `submit_runs` statement for those
        with small inputs, by tenant and request id (the order two batches that share a
        request id take it in), which also returns their jobs; a large input as its own
        `insert_run` (its job is then read from the outbox)."""
        found: dict[uuid.UUID, Run | RunwireError] = {}
        small: dict[str, list[tuple[_Submitted, str, str]]] = {}  # by actor: a statement
        alone: list[_Submitted] = []
        for item in sorted(items, key=lambda a: (a.tenant, a.request_id)):
            texts = json.dumps(item.input), json.dumps(item.metadata)
            if sum(map(len, texts)) > BATCHED_INPUT_BYTES:
                alone.append(item)
            else:
                small.setdefault(item.actor, []).append((item, *texts))
        for actor, group in small.items():
            try:
                rows = await self._fetch("submit_runs", *self._columns(group, actor))
            except (StoreError, QuotaExceeded, QueueFull) as exc:
                if len(group) == 1:
                    found[group[0][0].run_id] = exc  # its own fault
                    continue
                # One run's fault (a quota or its tenant's full queue that refuses it, a
                # value Postgres refuses): each on its own, so that only that run fails.
                alone.extend(item for item, _, _ in group)
                continue
            except RunwireError as exc:  # Postgres unavailable: every run of the batch
                found.update((item.run_id, exc) for item, _, _ in group)
                continue
            found.update((uuid.UUID(run.run_id), run) for run in runs_told(rows))
        for item in alone:
            try:
                run = await self._run_or_none("insert_run", *item)
            except RunwireError as exc:
                found[item.run_id] = exc
                continue
            if run is not None:
                found[item.run_id] = run
        # No row: the tenant already had the request id (a duplicate).
        return [found.get(item.run_id) for item in items]

    @staticmethod
    def _columns(group: list[tuple[_Submitted, str, str]], actor: str) -> list[Any]:
        """insert_runs' parameters: an array per field, the actor once; JSON as text."""
        items = [item for item, _, _ in group]
        return [
            [i.run_id for i in items],
            [i.tenant for i in items],
            [i.request_id for i in items],
            [i.multitask for i in items],
            [i.runner for i in items],
            [input_text for _, input_text, _ in group],
            [metadata_text for _, _, metadata_text in group],
            [i.max_attempts for i in items],
            [i.attempt_timeout_ms for i in items],
            [i.queue_timeout_ms for i in items],
            actor,
            [i.trace_parent for i in items],
            [i.config_pin for i in items],
            [i.budget_tokens for i in items],
            [i.budget_cost for i in items],
            [_json(i.effects) for i in items],
            [_json(i.workflow) for i in items],
            [i.priority for i in items],
            [i.concurrency_key for i in items],
            [i.not_before for i in items],
        ]

    async def insert_release(
        self, tenant: str, release_id: str, version: int, definition: dict[str, Any], digest: str
    ) -> tuple[str, bool] | None:
        """Store a release once: the stored digest and whether this call created it (None
        when another submitter stored it meanwhile: read it with `get_release`)."""
        rec = await self._fetchrow(
            "insert_release", tenant, release_id, version, definition, digest
        )
        return (rec["digest"], rec["created"]) if rec else None

    async def get_release(
        self, tenant: str, release_id: str, version: int | None
    ) -> dict[str, Any] | None:
        """A release (release_id, version, definition, digest); its highest version when
        `version` is None."""
        rec = await self._fetchrow("get_release", tenant, release_id, version)
        return dict(rec) if rec else None

    async def node_runs(self, run_id: str) -> list[dict[str, Any]]:
        """A workflow run's node runs, oldest first."""
        return [dict(r) for r in await self._fetch("node_runs", uuid.UUID(run_id))]

    async def active_node_runs(self, run_id: str) -> list[str]:
        """The runs of a workflow run's nodes that are running now."""
        return [str(r["run_id"]) for r in await self._fetch("active_node_runs", uuid.UUID(run_id))]

    async def request_cancel(
        self,
        tenant: str,
        run_id: str,
        error: ErrorBody,
        actor: str,
        *,
        grace_ms: int = DEFAULT_SUPERSEDE_GRACE_MS,
    ) -> Run | None:
        """Cancel a queued run, or flag a running one (closed later with `error`, holding
        its session for at most `grace_ms`); None when the run is terminal."""
        key = parse_run_id(run_id)
        if key is None:
            return None
        return await self._run_or_none(
            "request_cancel", tenant, key, error.model_dump(mode="json"), actor, grace_ms
        )

    async def cancel_session(
        self, tenant: str, session_id: str, error: ErrorBody, actor: str, *, grace_ms: int
    ) -> list[Run]:
        """`request_cancel` for every active run of a session, oldest first."""
        rows = await self._fetch(
            "cancel_session", tenant, session_id, error.model_dump(mode="json"), grace_ms, actor
        )
        return [Run.from_record(r) for r in rows]

    async def cancel_tenant(
        self, tenant: str, error: ErrorBody, actor: str, *, grace_ms: int
    ) -> list[Run]:
        """`request_cancel` for every active run of a tenant, oldest first."""
        rows = await self._fetch(
            "cancel_tenant", tenant, error.model_dump(mode="json"), grace_ms, actor
        )
        return [Run.from_record(r) for r in rows]

    async def forget_tenant(self, tenant: str) -> tuple[int, int, int]:
        """Delete what is kept of `tenant` unless a run of it is active: (active runs,
        runs deleted, releases deleted)."""
        rows = await self._fetch("forget_tenant", tenant)
        return rows[0]["active"], rows[0]["runs"], rows[0]["releases"]

    async def fail_queued(self, run_id: str, error: ErrorBody, actor: str) -> Run | None:
        return await self._run_or_none(
            "fail_queued", uuid.UUID(run_id), error.model_dump(mode="json"), actor
        )
