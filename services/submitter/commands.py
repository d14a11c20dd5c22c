"""What each command of the submitter does: validate, write Postgres, queue, reply.

Runs that share a `session_id` are submitted under the session's lock in Postgres, so
the `multitask` rule of a submit (interrupt, enqueue, reject) sees every earlier submit
of the session. A run whose session is busy is stored without a job; it gets one when
the runs before it have ended (`release_session`, also done by executors and recovery).
"""

import json
import logging
import uuid

from opentelemetry import trace
from pydantic import ValidationError

from contracts.commands import (
    AbortSessionCommand,
    CancelCommand,
    GetCommand,
    Multitask,
    SubmitCommand,
)
from contracts.errors import ErrorCode
from contracts.frames import Job
from contracts.replies import AbortSessionReply, RunReply, SubmitReply
from contracts.scripted import ScriptedInput
from contracts.status import RunStatus
from services.runtime import tracing
from services.runtime.broker import Broker
from services.runtime.closing import publish_closing
from services.runtime.commands import describe
from services.runtime.errors import (
    CANCELED_ERROR,
    QUEUE_FULL_ERROR,
    SUPERSEDED_ERROR,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    QueueFull,
    RunwireError,
    Unavailable,
)
from services.runtime.logs import bind, fields
from services.runtime.settings import SubmitterSettings
from services.runtime.store import Run, Store

log = logging.getLogger(__name__)

ACTOR = "submitter"
CANCELED = CANCELED_ERROR
SUPERSEDED = SUPERSEDED_ERROR
QUEUE_FULL = QUEUE_FULL_ERROR
# Input schemas the submitter checks before accepting a run, by runner name.
INPUT_MODELS = {"scripted": ScriptedInput}


class SessionBusy(RunwireError):
    code = ErrorCode.SESSION_BUSY
    retryable = False


class _Duplicate(RunwireError):
    """The request_id was taken meanwhile: roll back whatever the submit did, and answer
    with the first run. Never leaves this module."""

    code = ErrorCode.INVALID_REQUEST
    retryable = False


class Submitter:
    """The submitter's command handlers."""

    def __init__(self, settings: SubmitterSettings, store: Store, broker: Broker) -> None:
        self.settings = settings
        self.store = store
        self.broker = broker

    def _check_input(self, cmd: SubmitCommand) -> None:
        size = len(json.dumps(cmd.input).encode())
        if size > self.settings.max_input_bytes:
            raise PayloadTooLarge(
                f"input of {size} bytes is over the limit of {self.settings.max_input_bytes}"
            )
        model = INPUT_MODELS.get(cmd.runner)
        if model is None:
            raise InvalidRequest(
                f"unknown runner {cmd.runner!r}; known runners: {', '.join(INPUT_MODELS)}"
            )
        try:
            model.model_validate(cmd.input)
        except ValidationError as exc:
            raise InvalidRequest(f"input for runner {cmd.runner!r}: {describe(exc)}") from exc

    async def submit(self, tenant: str, cmd: SubmitCommand) -> SubmitReply:
        self._check_input(cmd)
        # A request_id used before is found by the insert (ON CONFLICT), or for a session
        # by `_make_room` under the session's lock, before it changes anything.
        canceled: list[Run] = []
        try:
            if cmd.session_id is None:
                run = await self._insert(self.store, tenant, cmd)
            else:
                async with self.store.session_lock(tenant, cmd.session_id) as tx:
                    canceled = await self._make_room(tx, tenant, cmd.session_id, cmd)
                    run = await self._insert(tx, tenant, cmd)
        except _Duplicate:  # the request_id was used before: answer with the first run
            first = await self.store.run_by_request(tenant, cmd.request_id)
            if first is None:
                raise Unavailable("run vanished after a conflicting insert") from None
            return SubmitReply(run=first.summary(), duplicate=True)
        await self._after_cancel(canceled)
        trace.get_current_span().set_attributes(tracing.run_attributes(run.run_id, tenant))
        with bind(run_id=run.run_id, tenant=tenant):
            if run.job_published_at is not None or cmd.session_id is None:
                await self._queue(run)
                log.info("run submitted")
            else:
                log.info("run submitted; it waits for the earlier runs of its session")
                # The run that held the session may have ended between our insert and
                # its executor's release, which then did not see us yet: look again.
                await self._release(tenant, cmd.session_id)
        return SubmitReply(run=run.summary(), duplicate=False)

    async def _make_room(
        self, tx: Store, tenant: str, session_id: str, cmd: SubmitCommand
    ) -> list[Run]:
        """Apply the submit's `multitask` rule, under the session's lock; returns the runs
        it canceled."""
        if await tx.run_by_request(tenant, cmd.request_id) is not None:
            raise _Duplicate("request_id already used")
        if cmd.multitask == Multitask.REJECT:
            active = await tx.session_active(tenant, session_id)
            if active:
                raise SessionBusy(f"session {session_id!r} has an active run {active[0]}")
        elif cmd.multitask == Multitask.INTERRUPT:
            return await tx.cancel_session(
                tenant, session_id, SUPERSEDED, ACTOR, grace_ms=self.settings.supersede_grace_ms
            )
        return []

    async def _insert(self, store: Store, tenant: str, cmd: SubmitCommand) -> Run:
        run = await store.insert_run(
            run_id=str(uuid.uuid4()),
            tenant=tenant,
            request_id=cmd.request_id,
            session_id=cmd.session_id,
            multitask=cmd.multitask.value,
            runner=cmd.runner,
            input=cmd.input,
            metadata=cmd.metadata,
            max_attempts=cmd.max_attempts or self.settings.default_max_attempts,
            attempt_timeout_ms=cmd.attempt_timeout_ms or self.settings.default_attempt_timeout_ms,
            queue_timeout_ms=cmd.queue_timeout_ms,
            actor=ACTOR,
            # The submit command's span: every later span of the run descends from it.
            trace_parent=tracing.current_traceparent(),
        )
        if run is None:
            raise _Duplicate("request_id already used")
        return run

    async def _queue(self, run: Run) -> None:
        try:
            await self.broker.publish_job(
                Job(run_id=run.run_id, tenant=run.tenant, generation=run.generation),
                traceparent=run.trace_parent,
            )
        except QueueFull:
            failed = await self.store.fail_queued(run.run_id, QUEUE_FULL, ACTOR)
            if failed is not None:
                await self._close_quietly(failed)
                if failed.session_id is not None:
                    await self._release(failed.tenant, failed.session_id)
            raise
        except Unavailable as exc:
            # The run is safe in Postgres; recovery publishes its job once NATS answers.
            log.warning("job not published yet, recovery will: %s", exc.message)

    async def _close_quietly(self, run: Run) -> None:
        try:
            await publish_closing(self.broker, run)
        except RunwireError as exc:
            log.warning("closing frames not published yet, recovery will: %s", exc.message)

    async def get(self, tenant: str, cmd: GetCommand) -> RunReply:
        run = await self.store.get_run(tenant, cmd.run_id)
        if run is None:
            raise NotFound(f"no run {cmd.run_id!r}")
        return RunReply(run=run.summary())

    async def cancel(self, tenant: str, cmd: CancelCommand) -> RunReply:
        return RunReply(run=(await self._cancel(tenant, cmd.run_id)).summary())

    async def _cancel(self, tenant: str, run_id: str) -> Run:
        run = await self.store.request_cancel(
            tenant, run_id, CANCELED, ACTOR, grace_ms=self.settings.supersede_grace_ms
        )
        if run is None:
            current = await self.store.get_run(tenant, run_id)
            if current is None:
                raise NotFound(f"no run {run_id!r}")
            return current  # terminal already: unchanged
        await self._after_cancel([run])
        if run.session_id is not None and run.status == RunStatus.CANCELED:
            await self._release(tenant, run.session_id)  # it may have been next in line
        return run

    async def _after_cancel(self, runs: list[Run]) -> None:
        """Close the runs a cancel ended at once; tell executors to stop the running ones."""
        for run in runs:
            with bind(run_id=run.run_id, tenant=run.tenant):
                if run.status == RunStatus.CANCELED:
                    await self._close_quietly(run)
                else:
                    await self.broker.notify(self.broker.subjects.cancel_notice(run.run_id))
                code = (run.cancel_error or {}).get("code")
                log.info("cancel requested", extra=fields(code=code))

    async def _release(self, tenant: str, session_id: str) -> None:
        """Publish the jobs of the session's runs whose turn has come."""
        for run in await self.store.release_session(tenant, session_id, ACTOR):
            with bind(run_id=run.run_id, tenant=tenant):
                try:
                    await self.broker.publish_job(
                        Job(run_id=run.run_id, tenant=run.tenant, generation=run.generation),
                        traceparent=run.trace_parent,
                    )
                except RunwireError as exc:
                    log.warning("job not published yet, recovery will: %s", exc.message)

    async def abort_session(self, tenant: str, cmd: AbortSessionCommand) -> AbortSessionReply:
        async with self.store.session_lock(tenant, cmd.session_id) as tx:
            runs = await tx.cancel_session(
                tenant,
                cmd.session_id,
                CANCELED,
                ACTOR,
                grace_ms=self.settings.supersede_grace_ms,
            )
        await self._after_cancel(runs)
        return AbortSessionReply(canceled=[run.run_id for run in runs])
