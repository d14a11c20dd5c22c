"""What each command of the submitter does: validate, write Postgres, queue, reply.

Runs that share a `session_id` are submitted under the session's lock in Postgres, so
the `multitask` rule of a submit (interrupt, enqueue, reject) sees every earlier submit
of the session. A run whose session is busy is stored without a job; it gets one in the
transaction that ends the run before it. Whatever a write implies (the job, closing
frames, run events) leaves through the outbox.
"""

import hashlib
import json
import logging
import uuid
from collections.abc import Coroutine
from typing import Any

from opentelemetry import trace

from runwire.contracts import commands, replies
from runwire.contracts.errors import ErrorCode
from runwire.contracts.frames import EffectData, EffectState, WaitData
from runwire.contracts.status import RunStatus
from runwire.contracts.workflows import NodeRunData, NodeStatus
from runwire.runners.effect_node import EFFECT_RUNNER
from runwire.runners.effects import policy_refusal
from runwire.runtime import tracing
from runwire.runtime.broker import Broker
from runwire.runtime.errors import (
    CANCELED_ERROR,
    QUEUE_FULL_ERROR,
    SUPERSEDED_ERROR,
    InvalidRequest,
    NotFound,
    NotWaiting,
    PayloadTooLarge,
    QueueFull,
    RunwireError,
    Unavailable,
)
from runwire.runtime.logs import bind, fields
from runwire.runtime.outbox import Outbox
from runwire.runtime.settings import SubmitterSettings
from runwire.runtime.store import Run, Store
from runwire.runtime.store.rows import parse_run_id
from runwire.runtime.store.waits import Answer
from runwire.submitter.runners import RunnerCatalog
from runwire.submitter.shapes import run_input, start_time

log = logging.getLogger(__name__)

ACTOR = "submitter"
CANCELED = CANCELED_ERROR
SUPERSEDED = SUPERSEDED_ERROR
QUEUE_FULL = QUEUE_FULL_ERROR
# The runner name of a workflow run (no executor claims one: Postgres drives it).
WORKFLOW_RUNNER = "workflow"
# Signals a workflow run keeps handed to its waiting node runs after one signal, at most
# (each in a transaction of its own).
MAX_KEPT_DELIVERIES = 50


class SessionBusy(RunwireError):
    code = ErrorCode.SESSION_BUSY
    retryable = False


class NotReschedulable(RunwireError):
    code = ErrorCode.NOT_RESCHEDULABLE
    retryable = False


class _Duplicate(RunwireError):
    """The request_id was taken meanwhile: roll back whatever the submit did, and answer
    with the first run. Never leaves this module."""

    code = ErrorCode.INVALID_REQUEST
    retryable = False


class Submitter:
    """The submitter's command handlers."""

    def __init__(
        self,
        settings: SubmitterSettings,
        store: Store,
        broker: Broker,
        outbox: Outbox,
        runners: RunnerCatalog,
    ) -> None:
        self.settings = settings
        self.store = store
        self.broker = broker
        self.outbox = outbox
        self.runners = runners

    async def release(self, tenant: str, cmd: commands.ReleaseCommand) -> replies.ReleaseReply:
        """Store a release for good, after checking that the deployment has every runner
        it names and that each node's input can fit its runner's (its graph was checked
        with the command's body)."""
        for node in cmd.definition.nodes:
            where = f"node {node.id!r}: "
            await self.runners.require(node.runs_with, where)
            if node.runner is not None:  # an effect node's input is its adapter's request
                await self.runners.check_template(node.runner, node.input, where)
        definition = cmd.definition.model_dump(mode="json", by_alias=True)
        for stored in definition["nodes"]:
            # Left out when not set: a release published before the field keeps its digest.
            if not stored["fallback_after_effect"]:
                del stored["fallback_after_effect"]
            if stored["signal"] is None:
                del stored["signal"]
        digest = hashlib.sha256(
            json.dumps(definition, sort_keys=True, separators=(",", ":")).encode()
        ).hexdigest()
        stored = await self.store.insert_release(
            tenant, cmd.release_id, cmd.version, definition, digest
        )
        if stored is None:  # another submitter stored it meanwhile
            existing = await self.store.get_release(tenant, cmd.release_id, cmd.version)
            if existing is None:
                raise Unavailable("release vanished after a conflicting insert")
            stored = (existing["digest"], False)
        stored_digest, created = stored
        if stored_digest != digest:
            raise InvalidRequest(
                f"release {cmd.release_id!r} version {cmd.version} exists with another "
                "definition; a release never changes: publish it as a new version"
            )
        if created:
            log.info(
                "release published",
                extra=fields(
                    tenant=tenant, release_id=cmd.release_id, version=cmd.version, digest=digest
                ),
            )
        return replies.ReleaseReply(
            release_id=cmd.release_id,
            version=cmd.version,
            digest=digest,
            nodes=len(cmd.definition.nodes),
            created=created,
        )

    async def _workflow(self, tenant: str, cmd: commands.SubmitCommand) -> dict[str, Any] | None:
        """The release a workflow submit runs ({release_id, version}), or None for a run
        of one runner."""
        if cmd.workflow is None:
            return None
        ref = cmd.workflow
        found = await self.store.get_release(tenant, ref.release_id, ref.version)
        if found is None:
            version = f" version {ref.version}" if ref.version is not None else ""
            raise NotFound(f"no release {ref.release_id!r}{version}; publish it with release")
        return {"release_id": found["release_id"], "version": found["version"]}

    async def _check_input(self, cmd: commands.SubmitCommand) -> None:
        if cmd.workflow is not None:
            size = len(json.dumps(cmd.workflow.input).encode())
            if size > self.settings.max_input_bytes:
                raise PayloadTooLarge(
                    f"workflow input of {size} bytes is over the limit of "
                    f"{self.settings.max_input_bytes}"
                )
        size = len(json.dumps(cmd.input).encode())
        if size > self.settings.max_input_bytes:
            raise PayloadTooLarge(
                f"input of {size} bytes is over the limit of {self.settings.max_input_bytes}"
            )
        if cmd.metadata:
            size = len(json.dumps(cmd.metadata).encode())
            if size > self.settings.max_metadata_bytes:
                raise PayloadTooLarge(
                    f"metadata of {size} bytes is over the limit of "
                    f"{self.settings.max_metadata_bytes}"
                )
        if cmd.workflow is None:
            await self.runners.check(cmd.runner, cmd.input)

    async def _effect_refusal(self, tenant: str, cmd: commands.SubmitCommand) -> str | None:
        """Why a run of the effect runner may not perform its effect's kind (its tenant's
        policy, or the run's own `effects`), or None. Refused at submit rather than
        failed at its claim; the claim checks again, as a policy may change meanwhile."""
        if cmd.workflow is not None or cmd.runner != EFFECT_RUNNER:
            return None
        kind = cmd.input.get("kind")
        if not isinstance(kind, str):
            return None  # the input check answers for a malformed input
        effects, version = await self.store.tenant_policy(tenant)
        if not replies.PolicyReply(tenant=tenant, effects=effects, version=version).allows(kind):
            return policy_refusal(kind, tenant)
        if cmd.effects is not None and kind not in cmd.effects:
            return f"the run's own effects ({', '.join(cmd.effects)}) exclude kind {kind!r}"
        return None

    async def submit(self, tenant: str, cmd: commands.SubmitCommand) -> replies.SubmitReply:
        await self._check_input(cmd)
        refusal = await self._effect_refusal(tenant, cmd)
        if refusal is not None:
            # A repeat of a submit that created its run before the policy changed still
            # answers with that run.
            first = await self.store.run_by_request(tenant, cmd.request_id)
            if first is not None:
                return self._reply(first, duplicate=True)
            raise InvalidRequest(refusal)
        workflow = await self._workflow(tenant, cmd)
        # A request_id used before is found by the insert (ON CONFLICT), or for a session
        # by `_make_room` under the session's lock, before it changes anything.
        canceled: list[Run] = []
        try:
            if cmd.session_id is None:
                run = await self._insert(self.store, tenant, cmd, workflow)
            else:
                async with self.store.session_lock(tenant, cmd.session_id) as tx:
                    canceled = await self._make_room(tx, tenant, cmd.session_id, cmd)
                    joined = await self._coalesce(tx, tenant, cmd.session_id, cmd)
                    if joined is not None:
                        return self._reply(joined, duplicate=False, coalesced=True)
                    run = await self._insert(tx, tenant, cmd, workflow)
        except _Duplicate:  # the request_id was used before: answer with the first run
            first = await self.store.run_by_request(tenant, cmd.request_id)
            if first is None:
                raise Unavailable("run vanished after a conflicting insert") from None
            return self._reply(first, duplicate=True)
        # One transaction for an interrupt and the insert: its messages are published once.
        dispatched = await self.outbox.dispatch(*canceled, run)
        await self._notify_canceled(canceled)
        trace.get_current_span().set_attributes(tracing.run_attributes(run.run_id, tenant))
        with bind(run_id=run.run_id, tenant=tenant):
            if run.run_id in dispatched.queue_full:
                await self._queue_full(run)
            if run.job_published_at is not None:
                log.info("run submitted")
            else:
                log.info("run submitted; it waits for the earlier runs of its session")
        return self._reply(run, duplicate=False)

    async def _coalesce(
        self, tx: Store, tenant: str, session_id: str, cmd: commands.SubmitCommand
    ) -> Run | None:
        """multitask `coalesce`: the session's coalesced run that has not started takes
        this submit's input (under the session's lock); None: a new run is made."""
        if cmd.multitask != commands.Multitask.COALESCE:
            return None
        return await tx.coalesce_into(
            tenant,
            session_id,
            cmd.runner,
            cmd.input,
            cmd.request_id,
            self.settings.max_input_bytes,
        )

    def _reply(self, run: Run, *, duplicate: bool, coalesced: bool = False) -> replies.SubmitReply:
        subjects = self.broker.subjects
        return replies.SubmitReply(
            run=run.summary(),
            duplicate=duplicate,
            coalesced=coalesced,
            frames=replies.FrameChannel(
                stream=subjects.run_frames_stream,
                subject=subjects.run_frames(run.tenant, run.run_id),
            ),
        )

    async def _make_room(
        self, tx: Store, tenant: str, session_id: str, cmd: commands.SubmitCommand
    ) -> list[Run]:
        """Apply the submit's `multitask` rule, under the session's lock; returns the runs
        it canceled."""
        if await tx.run_by_request(tenant, cmd.request_id) is not None:
            raise _Duplicate("request_id already used")
        if cmd.multitask == commands.Multitask.REJECT:
            active = await tx.session_active(tenant, session_id)
            if active:
                raise SessionBusy(f"session {session_id!r} has an active run {active[0]}")
        elif cmd.multitask == commands.Multitask.INTERRUPT:
            return await tx.cancel_session(
                tenant, session_id, SUPERSEDED, ACTOR, grace_ms=self.settings.supersede_grace_ms
            )
        else:
            waiting = await tx.session_active(tenant, session_id)
            if len(waiting) >= self.settings.max_session_waiting:
                raise SessionBusy(
                    f"session {session_id!r} has {len(waiting)} runs active or waiting; the "
                    f"limit is {self.settings.max_session_waiting}"
                )
        return []

    async def _insert(
        self,
        store: Store,
        tenant: str,
        cmd: commands.SubmitCommand,
        workflow: dict[str, Any] | None,
    ) -> Run:
        run = await store.insert_run(
            run_id=str(uuid.uuid4()),
            tenant=tenant,
            request_id=cmd.request_id,
            session_id=cmd.session_id,
            multitask=cmd.multitask.value,
            runner=cmd.runner if cmd.workflow is None else WORKFLOW_RUNNER,
            input=run_input(cmd),
            metadata=cmd.metadata,
            max_attempts=cmd.max_attempts or self.settings.default_max_attempts,
            attempt_timeout_ms=cmd.attempt_timeout_ms or self.settings.default_attempt_timeout_ms,
            queue_timeout_ms=cmd.queue_timeout_ms,
            actor=ACTOR,
            # The submit command's span: every later span of the run descends from it.
            trace_parent=tracing.current_traceparent(),
            config_pin=self.runners.pin(cmd.runner, cmd.input) if workflow is None else None,
            budget_tokens=cmd.budget_tokens,
            budget_cost=cmd.budget_cost,
            effects=cmd.effects,
            workflow=workflow,
            priority=cmd.priority,
            concurrency_key=cmd.concurrency_key,
            not_before=start_time(cmd.not_before, cmd.delay_ms or cmd.coalesce_ms),
        )
        if run is None:
            raise _Duplicate("request_id already used")
        return run

    async def _queue_full(self, run: Run) -> None:
        """The jobs stream refused the run's job: the run fails with QUEUE_FULL (its
        closing frames and the next run of its session follow from that write)."""
        failed = await self.store.fail_queued(run.run_id, QUEUE_FULL, ACTOR)
        await self.outbox.dispatch(failed)
        raise QueueFull("the queue is full; submit again later with a new request_id")

    async def get(self, tenant: str, cmd: commands.GetCommand) -> replies.RunReply:
        run = await self.store.get_run(tenant, cmd.run_id)
        if run is None:
            raise NotFound(f"no run {cmd.run_id!r}")
        return await self._with_effects(run)

    async def _with_effects(self, run: Run) -> replies.RunReply:
        effects = [
            EffectData(
                key=e["key"],
                kind=e["kind"],
                state=EffectState(e["state"]),
                receipt_id=str(e["receipt"]["id"])
                if isinstance(e["receipt"], dict) and "id" in e["receipt"]
                else None,
                error=e["error"],
            )
            for e in await self.store.run_effects(run.run_id)
        ]
        nodes = (
            [
                NodeRunData(
                    node_id=n["node_id"],
                    slot=n["slot"],
                    node_run_id=str(n["node_run_id"]),
                    status=NodeStatus(n["status"]),
                    attempt=n["attempt"],
                    version=n["version"],
                    output=n["output"],
                    error=n["error"],
                    waiting_for=_node_wait(n),
                )
                for n in await self.store.node_runs(run.run_id)
            ]
            if run.workflow is not None
            else []
        )
        waiting_for = None
        if run.status == RunStatus.WAITING:
            wait = await self.store.waiting_for(run.run_id)
            waiting_for = WaitData.model_validate(wait) if wait is not None else None
        spent = await self.store.run_budget(run.run_id)
        budget = None
        if spent is not None:
            budget = replies.RunBudget(
                tokens=spent["budget_tokens"],
                cost=spent["budget_cost"],
                **{k: int(v) for k, v in spent.items() if not k.startswith("budget_")},
            )
        queued_for = limit_key = None
        if run.status == RunStatus.QUEUED and (
            run.job_published_at is None or run.limit_key is not None
        ):
            queued_for = await self.store.queued_for(run.run_id)
            if queued_for == "rate_limit":
                limit_key = run.limit_key
        update = {
            "limit_key": limit_key,
            "effects": effects,
            "nodes": nodes,
            "waiting_for": waiting_for,
            "budget": budget,
            "queued_for": queued_for,
        }
        return replies.RunReply(run=run.summary().model_copy(update=update))

    async def resolve_effect(
        self, tenant: str, cmd: commands.ResolveEffectCommand
    ) -> replies.RunReply:
        run = await self.store.get_run(tenant, cmd.run_id)
        if run is None:
            raise NotFound(f"no run {cmd.run_id!r}")
        state = await self.store.resolve_effect(
            tenant, run.run_id, cmd.key, cmd.receipt, cmd.error, "operator"
        )
        if state is None:
            known = {e["key"]: e["state"] for e in await self.store.run_effects(run.run_id)}
            if cmd.key not in known:
                raise NotFound(f"run {run.run_id} has no effect {cmd.key!r}")
            raise InvalidRequest(
                f"effect {cmd.key!r} is {known[cmd.key]}: only an unknown or claimed effect, "
                "or one failed by its deadline, can be resolved"
            )
        with bind(run_id=run.run_id, tenant=tenant):
            log.warning("effect resolved by an operator", extra=fields(key=cmd.key, state=state))
        return await self._with_effects(run)

    async def cancel(self, tenant: str, cmd: commands.CancelCommand) -> replies.RunReply:
        return replies.RunReply(run=(await self._cancel(tenant, cmd.run_id)).summary())

    async def _cancel(self, tenant: str, run_id: str) -> Run:
        run = await self.store.request_cancel(
            tenant, run_id, CANCELED, ACTOR, grace_ms=self.settings.supersede_grace_ms
        )
        if run is None:
            current = await self.store.get_run(tenant, run_id)
            if current is None:
                raise NotFound(f"no run {run_id!r}")
            return current  # terminal already: unchanged
        await self.outbox.dispatch(run)
        await self._notify_canceled([run])
        return run

    async def _notify_canceled(self, runs: list[Run]) -> None:
        """Tell executors to stop the runs a cancel flagged while they run (the closing
        frames of the runs it ended at once left through the outbox)."""
        for run in runs:
            with bind(run_id=run.run_id, tenant=run.tenant):
                if run.status != RunStatus.CANCELED:
                    await self.broker.notify(self.broker.subjects.cancel_notice(run.run_id))
                if run.workflow is not None:  # its node runs that an executor runs now
                    for node_run in await self.store.active_node_runs(run.run_id):
                        await self.broker.notify(self.broker.subjects.cancel_notice(node_run))
                code = run.cancel_error.code if run.cancel_error else None
                log.info("cancel requested", extra=fields(code=code))

    async def abort_session(
        self, tenant: str, cmd: commands.AbortSessionCommand
    ) -> replies.AbortSessionReply:
        async with self.store.session_lock(tenant, cmd.session_id) as tx:
            runs = await tx.cancel_session(
                tenant,
                cmd.session_id,
                CANCELED,
                ACTOR,
                grace_ms=self.settings.supersede_grace_ms,
            )
        await self.outbox.dispatch(*runs)
        await self._notify_canceled(runs)
        return replies.AbortSessionReply(canceled=[run.run_id for run in runs])

    async def list_runs(self, tenant: str, cmd: commands.ListCommand) -> replies.ListReply:
        page = await self.store.list_runs(
            tenant,
            status=cmd.status,
            runner=cmd.runner,
            session_id=cmd.session_id,
            before=cmd.before,
            limit=cmd.limit,
            created_after=cmd.created_after,
            created_before=cmd.created_before,
        )
        runs = [
            run.summary().model_copy(
                update={"waiting_for": WaitData.model_validate(wait) if wait else None}
            )
            for run, wait in page
        ]
        last = page[-1][0].submit_seq if len(page) == cmd.limit else None
        return replies.ListReply(runs=runs, next=last)

    async def reschedule(self, tenant: str, cmd: commands.RescheduleCommand) -> replies.RunReply:
        when = start_time(cmd.not_before, cmd.delay_ms)
        assert when is not None  # the command gives one or the other
        xact = await self.store.reschedule_run(tenant, cmd.run_id, when, ACTOR)
        if xact is None:
            run = await self.store.get_run(tenant, cmd.run_id)
            if run is None:
                raise NotFound(f"no run {cmd.run_id!r}")
            held = "has its job already" if run.status == RunStatus.QUEUED else run.status.value
            raise NotReschedulable(f"run {cmd.run_id} cannot be rescheduled: it {held}")
        await self.outbox.dispatch_xact(xact)
        return replies.RunReply(run=await self._summary(tenant, cmd.run_id))

    async def resume(self, tenant: str, cmd: commands.ResumeCommand) -> replies.ResumeReply:
        answer, xact = await self._answer(
            cmd.run_id,
            self.store.resume_run(
                tenant, cmd.run_id, cmd.wait_id, cmd.value, cmd.request_id, ACTOR
            ),
        )
        if answer == Answer.TIMED_OUT:
            raise NotWaiting(f"the wait of run {cmd.run_id} timed out: the runner sees WaitTimeout")
        if answer == Answer.NOT_WAITING:
            which = f"for {cmd.wait_id!r}" if cmd.wait_id else "for an answer"
            raise NotWaiting(f"run {cmd.run_id} does not wait {which}")
        await self.outbox.dispatch_xact(xact)
        return replies.ResumeReply(
            run=await self._summary(tenant, cmd.run_id), duplicate=answer == Answer.DUPLICATE
        )

    async def signal(self, tenant: str, cmd: commands.SignalCommand) -> replies.SignalReply:
        answer, xact = await self._answer(
            cmd.run_id,
            self.store.signal_run(tenant, cmd.run_id, cmd.name, cmd.payload, cmd.request_id, ACTOR),
        )
        if answer == Answer.NOT_WAITING:
            raise NotWaiting(f"run {cmd.run_id} has ended: it takes no signal")
        await self.outbox.dispatch_xact(xact)
        delivered = answer == Answer.DELIVERED
        if not delivered:
            # A workflow run keeps it for its nodes: one that waits for it takes it now.
            # Also after a duplicate: a submitter that stopped between the two kept it.
            delivered = await self._deliver_kept(tenant, cmd.run_id)
        return replies.SignalReply(
            run=await self._summary(tenant, cmd.run_id),
            delivered=delivered,
            duplicate=answer == Answer.DUPLICATE,
        )

    async def _deliver_kept(self, tenant: str, run_id: str) -> bool:
        """Hand the signals a workflow run keeps to its node runs that wait for them, in
        transactions after the one that kept them; whether any was handed."""
        delivered = False
        for _ in range(MAX_KEPT_DELIVERIES):
            result, xact = await self.store.deliver_kept_signal(tenant, run_id, ACTOR)
            if result == "none":
                break
            if result == "delivered":
                delivered = True
                await self.outbox.dispatch_xact(xact)
        return delivered

    async def _answer(
        self, run_id: str, asking: Coroutine[Any, Any, tuple[Answer, str | None]]
    ) -> tuple[Answer, str | None]:
        if parse_run_id(run_id) is None:
            asking.close()
            raise NotFound(f"no run {run_id!r}")
        answer, xact = await asking
        if answer == Answer.NOT_FOUND:
            raise NotFound(f"no run {run_id!r}")
        return answer, xact

    async def _summary(self, tenant: str, run_id: str) -> replies.RunSummary:
        run = await self.store.get_run(tenant, run_id)
        if run is None:
            raise NotFound(f"no run {run_id!r}")
        return (await self._with_effects(run)).run

    async def forget_tenant(
        self, tenant: str, cmd: commands.ForgetTenantCommand
    ) -> replies.ForgetTenantReply:
        active, runs, releases = await self.store.forget_tenant(tenant)
        if active == 0:
            log.info("tenant forgotten", extra=fields(tenant=tenant, runs=runs, releases=releases))
        return replies.ForgetTenantReply(
            forgotten=active == 0, active=active, runs=runs, releases=releases
        )

    async def end_tenant(
        self, tenant: str, cmd: commands.EndTenantCommand
    ) -> replies.EndTenantReply:
        # Its schedules first: they would start new runs (and keep it from being forgotten).
        await self.store.pause_schedules(tenant)
        runs = await self.store.cancel_tenant(
            tenant, CANCELED, ACTOR, grace_ms=self.settings.supersede_grace_ms
        )
        await self.outbox.dispatch(*runs)
        await self._notify_canceled(runs)
        log.info("tenant ended", extra=fields(tenant=tenant, canceled=len(runs)))
        return replies.EndTenantReply(canceled=[run.run_id for run in runs])


def _node_wait(node: dict[str, Any]) -> dict[str, Any] | None:
    """What a waiting node's run waits for (WaitData's fields), or None."""
    if node["wait_id"] is None:
        return None
    wait = WaitData(
        wait_id=node["wait_id"],
        kind=node["wait_kind"],
        payload=node["wait_payload"],
        name=node["wait_name"],
        timeout_at=node["wait_timeout_at"],
    )
    return wait.model_dump(mode="json")
