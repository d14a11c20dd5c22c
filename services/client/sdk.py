"""The async Python client: connect, submit, get, cancel, abort_session, budgets,
policies, workflows and effects; following runs (`join`, `stream`, `events`) is
follow.py's, the connection's requests and errors connection.py's.

`stream(run_id, after)` yields every frame after the cursor exactly once and in order
until `done`, re-joining by itself when the connection, the relay or the live
subscription is lost.
"""

import asyncio
import logging
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from pydantic import ValidationError

from runwire.client.connection import (
    ClientError,
    Refusals,
    unauthorized,
)
from runwire.client.follow import Following
from runwire.client.settings import (
    UP_HINT,
    load_settings,
    server_urls,
    tls_context,
    unreachable_hint,
)
from runwire.contracts import commands, replies
from runwire.contracts.errors import ErrorBody, ErrorCode
from runwire.contracts.frames import Transcript
from runwire.contracts.health import HealthReply
from runwire.contracts.status import RunStatus
from runwire.contracts.subjects import inbox_prefix
from runwire.contracts.workflows import WorkflowDefinition, WorkflowRef

__all__ = ["Client", "ClientError", "Transcript"]

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5.0
HEALTH_WAIT_S = 0.5
# A probe (`runwire health SERVICE --local`) waits this long at most, and returns as soon
# as its replica says it is ok.
PROBE_WAIT_S = 5.0
# How long a client whose credentials were refused waits before asking once more.
CREDENTIALS_RETRY_S = 0.5
# Runs submitted by this client that it remembers as fresh (see `Following.stream`).
FRESH_RUNS = 10_000


async def _dial(
    urls: list[str], options: dict[str, Any], refusals: Refusals, timeout: float
) -> NatsClient | None:
    """A connection, or None when the server refused its credentials. TimeoutError when
    neither came within `timeout` seconds."""
    connecting = asyncio.ensure_future(nats.connect(urls, error_cb=refusals.on_error, **options))
    refused = asyncio.ensure_future(refusals.credentials_refused.wait())
    try:
        await asyncio.wait(
            [connecting, refused], timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if connecting.done():
            return connecting.result()
        connecting.cancel()
        if refused.done():
            return None
        raise TimeoutError(f"no connection within {timeout}s")
    finally:
        refused.cancel()


class Client(Following):
    """A connection to runwire for one tenant."""

    @classmethod
    async def connect(
        cls,
        url: str | None = None,
        *,
        tenant: str | None = None,
        prefix: str | None = None,
        user: str | None = None,
        password: str | None = None,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        inbox: str | None = None,
        tls_ca: Path | None = None,
    ) -> "Client":
        """Connect to NATS; after the first connection, reconnect for as long as it takes.

        Unless `url`, `tenant` and `prefix` are all given, what is not given is found the
        way the CLI finds it: `RUNWIRE_NATS_URL`, `RUNWIRE_TENANT`, `RUNWIRE_PREFIX`,
        `RUNWIRE_NATS_USER` and `RUNWIRE_NATS_PASSWORD` (on a broker that enforces
        identities: the tenant's, which `runwire tenant add` writes), then the nearest
        `.runwire/env` (which `make up` writes), then the defaults; a settings file named
        by `RUNWIRE_ENV_FILE` wins over the variables. Refused credentials
        raise ClientError(UNAUTHORIZED). Replies arrive under the tenant's inbox prefix
        (`_INBOX_<tenant>`), or `inbox`: an identity that is not a tenant's (a service's,
        asking its own health) hears replies only in its own. `tls_ca` (or
        `RUNWIRE_NATS_TLS_CA`): the authority of the servers' certificates, for a TLS
        connection.
        """
        hint = UP_HINT
        if url is None or tenant is None or prefix is None:
            found = load_settings()
            if url is None:
                url, hint = found.nats_url, unreachable_hint(found)
            tenant = found.tenant if tenant is None else tenant
            prefix = found.prefix if prefix is None else prefix
            if user is None and found.nats_user is not None:
                user = found.nats_user
                if password is None and found.nats_password is not None:
                    password = found.nats_password.get_secret_value()
            tls_ca = found.nats_tls_ca if tls_ca is None else tls_ca
        options: dict[str, Any] = {
            "dont_randomize": True,
            "name": "runwire-client",
            "max_reconnect_attempts": -1,
            "inbox_prefix": inbox or inbox_prefix(tenant),
            "user": user,
            "password": password,
            "tls": tls_context(tls_ca),
        }
        loop = asyncio.get_running_loop()
        deadline = loop.time() + connect_timeout
        try:
            refusals = Refusals()
            nc = await _dial(server_urls(url), options, refusals, connect_timeout)
            if nc is None and deadline - loop.time() > CREDENTIALS_RETRY_S:
                # A server reading its configuration again (a tenant added or removed) may
                # refuse for a moment an identity it keeps: asked once more, it answers.
                await asyncio.sleep(CREDENTIALS_RETRY_S)
                refusals = Refusals()
                nc = await _dial(server_urls(url), options, refusals, deadline - loop.time())
        except (TimeoutError, OSError, nats.errors.Error) as exc:
            raise ClientError(
                ErrorBody(
                    code=ErrorCode.UNAVAILABLE,
                    message=f"cannot reach NATS at {url} ({hint})",
                    retryable=True,
                )
            ) from exc
        if nc is None:
            raise unauthorized(
                f"NATS at {url} refused the identity {user or '(none)'}: give the "
                "tenant's settings (RUNWIRE_NATS_USER, RUNWIRE_NATS_PASSWORD; "
                "`runwire tenant add` writes them)"
            )
        return cls(
            nc, tenant=tenant, prefix=prefix, refusals=refusals if user is not None else None
        )

    async def health(
        self,
        service: str,
        *,
        wait: float = HEALTH_WAIT_S,
        enough: Callable[[HealthReply], bool] | None = None,
    ) -> list[HealthReply]:
        """The health of every replica of `service` (submitter, executor, relay,
        recovery) that answers within `wait` seconds; an executor's lists its runners.
        With `enough`, the replies so far as soon as one is `enough`."""
        inbox = self.nc.new_inbox()
        sub = await self.nc.subscribe(inbox)
        replies: list[HealthReply] = []
        try:
            await self.nc.publish(self.subjects.health(service), b"", reply=inbox)
            deadline = asyncio.get_running_loop().time() + wait
            while (left := deadline - asyncio.get_running_loop().time()) > 0:
                try:
                    msg = await sub.next_msg(timeout=left)
                except nats.errors.TimeoutError:
                    break
                try:
                    reply = HealthReply.model_validate_json(msg.data)
                except ValidationError:
                    continue
                replies.append(reply)
                if enough is not None and enough(reply):
                    break
        finally:
            await sub.unsubscribe()
        return replies

    async def submit(
        self, input: dict[str, Any], *, request_id: str | None = None, **options: Any
    ) -> replies.SubmitReply:
        """Submit a run; `options` are the optional fields of the submit command."""
        cmd = commands.SubmitCommand(
            request_id=request_id or str(uuid.uuid4()), input=input, **options
        )
        return await self.submit_command(cmd)

    async def submit_command(self, cmd: commands.SubmitCommand) -> replies.SubmitReply:
        """Submit a run from a submit command already made (as the gateway does)."""
        reply: replies.SubmitReply = await self._request("submit", cmd, replies.SubmitReply)
        if not reply.duplicate:
            self._fresh[reply.run.run_id] = reply.frames
            while len(self._fresh) > FRESH_RUNS:
                self._fresh.popitem(last=False)
        return reply

    async def submit_workflow(
        self,
        release_id: str,
        input: dict[str, Any],
        *,
        version: int | None = None,
        request_id: str | None = None,
        **options: Any,
    ) -> replies.SubmitReply:
        """Submit a workflow run of release `release_id` (its highest version unless
        `version`) on `input`; `options` are the other optional fields of submit."""
        cmd = commands.SubmitCommand(
            request_id=request_id or str(uuid.uuid4()),
            workflow=WorkflowRef(release_id=release_id, version=version, input=input),
            **options,
        )
        return await self.submit_command(cmd)

    async def release(
        self, release_id: str, version: int, definition: WorkflowDefinition | dict[str, Any]
    ) -> replies.ReleaseReply:
        """Publish a workflow release (nodes and edges) under an id and a version, for
        good; the same again answers `created: false`, another definition is refused."""
        if not isinstance(definition, WorkflowDefinition):
            definition = WorkflowDefinition.model_validate(definition)
        cmd = commands.ReleaseCommand(release_id=release_id, version=version, definition=definition)
        reply: replies.ReleaseReply = await self._request("release", cmd, replies.ReleaseReply)
        return reply

    async def get(self, run_id: str) -> replies.RunSummary:
        reply: replies.RunReply = await self._request(
            "get", commands.GetCommand(run_id=run_id), replies.RunReply
        )
        return reply.run

    async def cancel(self, run_id: str) -> replies.RunSummary:
        reply: replies.RunReply = await self._request(
            "cancel", commands.CancelCommand(run_id=run_id), replies.RunReply
        )
        return reply.run

    async def set_schedule(self, name: str, cron: str, **options: Any) -> replies.SchedulesReply:
        """Create or replace the schedule `name` firing at `cron` (five fields, or six with
        seconds first); `options`: tz, runner, input, overlap, catch_up_s, paused."""
        cmd = commands.SetScheduleCommand(name=name, cron=cron, **options)
        reply: replies.SchedulesReply = await self._request(
            "set_schedule", cmd, replies.SchedulesReply
        )
        return reply

    async def remove_schedule(self, name: str) -> replies.SchedulesReply:
        cmd = commands.RemoveScheduleCommand(name=name)
        reply: replies.SchedulesReply = await self._request(
            "remove_schedule", cmd, replies.SchedulesReply
        )
        return reply

    async def schedules(self) -> replies.SchedulesReply:
        reply: replies.SchedulesReply = await self._request(
            "list_schedules", commands.ListSchedulesCommand(), replies.SchedulesReply
        )
        return reply

    async def backfill_schedule(
        self, name: str, start: datetime, end: datetime
    ) -> replies.SchedulesReply:
        """Make the runs of the schedule's fires from `start` to `end` (past), each once:
        `made` says how many were new."""
        cmd = commands.BackfillScheduleCommand(name=name, start=start, end=end)
        reply: replies.SchedulesReply = await self._request(
            "backfill_schedule", cmd, replies.SchedulesReply
        )
        return reply

    async def set_webhooks(
        self, endpoints: list[dict[str, Any]], *, rotate_secret: bool = False
    ) -> replies.WebhooksReply:
        """Replace the tenant's webhook endpoints (`{"url": ..., "events": ["ended",
        "waiting"]}` each); the reply's `secret` is there the first time, or with
        `rotate_secret`: keep it, it signs every delivery."""
        cmd = commands.SetWebhooksCommand.model_validate(
            {"endpoints": endpoints, "rotate_secret": rotate_secret}
        )
        reply: replies.WebhooksReply = await self._request(
            "set_webhooks", cmd, replies.WebhooksReply
        )
        return reply

    async def webhooks(self) -> replies.WebhooksReply:
        """The tenant's webhook endpoints, deliveries pending and failed for good."""
        reply: replies.WebhooksReply = await self._request(
            "get_webhooks", commands.GetWebhooksCommand(), replies.WebhooksReply
        )
        return reply

    async def reschedule(
        self, run_id: str, *, delay_ms: int | None = None, not_before: datetime | None = None
    ) -> replies.RunSummary:
        """Move the start of a run that waits without a job (a delayed run) to `delay_ms`
        from now or to `not_before`. ClientError(NOT_RESCHEDULABLE) once it has its job."""
        cmd = commands.RescheduleCommand(run_id=run_id, delay_ms=delay_ms, not_before=not_before)
        reply: replies.RunReply = await self._request("reschedule", cmd, replies.RunReply)
        return reply.run

    async def resolve_effect(
        self,
        run_id: str,
        key: str,
        *,
        receipt: dict[str, Any] | None = None,
        error: str | None = None,
    ) -> replies.RunSummary:
        """Settle a side effect whose outcome is unknown (or that failed by its deadline)
        with the receipt of what happened, or why it did not (operators only)."""
        cmd = commands.ResolveEffectCommand(run_id=run_id, key=key, receipt=receipt, error=error)
        reply: replies.RunReply = await self._request("resolve_effect", cmd, replies.RunReply)
        return reply.run

    async def set_budget(self, **limits: int | None) -> replies.BudgetReply:
        """Set the tenant's limits: `tokens`, `cost` (units the tenant defines),
        `max_active_runs`, `max_runs_per_day`, its `share` of executor slots and its
        queue's capacity `max_queued_runs` (a limit left out keeps its value; None
        removes it). An operator's command."""
        reply: replies.BudgetReply = await self._request(
            "set_budget", commands.SetBudgetCommand(**limits), replies.BudgetReply
        )
        return reply

    async def set_rate_limit(
        self, key: str, *, rpm: int | None = None, tpm: int | None = None
    ) -> replies.RateLimitsReply:
        """Limit a model provider's key or one of its models (`openai`, `openai:gpt-4o`)
        to `rpm` requests and `tpm` tokens a minute, over every tenant; neither: remove
        the limit. An operator's command. Returns every limit."""
        cmd = commands.SetRateLimitCommand(key=key, rpm=rpm, tpm=tpm)
        reply: replies.RateLimitsReply = await self._request(
            "set_rate_limit", cmd, replies.RateLimitsReply
        )
        return reply

    async def rate_limits(self) -> replies.RateLimitsReply:
        """Every rate limit, what its last minute holds and the runs waiting for room."""
        reply: replies.RateLimitsReply = await self._request(
            "get_rate_limits", commands.GetRateLimitsCommand(), replies.RateLimitsReply
        )
        return reply

    async def budget(self) -> replies.BudgetReply:
        """The tenant's budgets, what its runs used and what they hold reserved."""
        reply: replies.BudgetReply = await self._request(
            "get_budget", commands.GetBudgetCommand(), replies.BudgetReply
        )
        return reply

    async def set_policy(self, *, effects: list[str] | None) -> replies.PolicyReply:
        """Set the effect kinds the tenant's runs may perform (None: every kind); until
        it is set, they may perform none. An operator's command (a tenant's own identity
        may not). Runs submitted before hold a stale authorization: their next effect
        fails with AUTHORIZATION_STALE."""
        reply: replies.PolicyReply = await self._request(
            "set_policy", commands.SetPolicyCommand(effects=effects), replies.PolicyReply
        )
        return reply

    async def policy(self) -> replies.PolicyReply:
        """The tenant's policy (version 0: never set, so no effect kind is allowed)."""
        reply: replies.PolicyReply = await self._request(
            "get_policy", commands.GetPolicyCommand(), replies.PolicyReply
        )
        return reply

    async def list_runs(
        self,
        *,
        status: RunStatus | str | None = None,
        runner: str | None = None,
        session_id: str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        limit: int = 50,
        before: int | None = None,
    ) -> replies.ListReply:
        """A page of the tenant's runs, newest first (of `status`, `runner`, `session_id`
        when given, created at or after `created_after` and before `created_before`,
        aware datetimes); its `next` gives the page after it as `before`."""
        cmd = commands.ListCommand(
            status=RunStatus(status) if status is not None else None,
            runner=runner,
            session_id=session_id,
            created_after=created_after,
            created_before=created_before,
            limit=limit,
            before=before,
        )
        reply: replies.ListReply = await self._request("list", cmd, replies.ListReply)
        return reply

    async def resume(
        self,
        run_id: str,
        value: Any = None,
        *,
        wait_id: str | None = None,
        request_id: str | None = None,
    ) -> replies.ResumeReply:
        """Answer the interrupt a waiting run waits for (`wait_id`: that one only); the
        runner's `ctx.interrupt` returns `value`. The same `request_id` again is the
        same answer (`duplicate`). ClientError(NOT_WAITING) when the run does not wait."""
        cmd = commands.ResumeCommand(
            request_id=request_id or str(uuid.uuid4()), run_id=run_id, wait_id=wait_id, value=value
        )
        reply: replies.ResumeReply = await self._request("resume", cmd, replies.ResumeReply)
        return reply

    async def signal(
        self, run_id: str, name: str, payload: Any = None, *, request_id: str | None = None
    ) -> replies.SignalReply:
        """Send the run the signal `name`: a wait of it for that name takes it, now
        (`delivered`) or when the runner waits for it. The same `request_id` again is the
        same signal (`duplicate`)."""
        cmd = commands.SignalCommand(
            request_id=request_id or str(uuid.uuid4()), run_id=run_id, name=name, payload=payload
        )
        reply: replies.SignalReply = await self._request("signal", cmd, replies.SignalReply)
        return reply

    async def abort_session(self, session_id: str) -> list[str]:
        reply: replies.AbortSessionReply = await self._request(
            "abort_session",
            commands.AbortSessionCommand(session_id=session_id),
            replies.AbortSessionReply,
        )
        return reply.canceled

    async def end_tenant(self) -> list[str]:
        """Cancel every active and queued run of this client's tenant; their ids, oldest
        first (an operator's command: a tenant's identity is refused it)."""
        reply: replies.EndTenantReply = await self._request(
            "end_tenant", commands.EndTenantCommand(), replies.EndTenantReply
        )
        return reply.canceled

    async def forget_tenant(self) -> replies.ForgetTenantReply:
        """Delete what runwire keeps of this client's tenant (removed: see `runwire tenant
        remove`), unless a run of it is still active: then nothing, and the reply says how
        many are (an operator's command)."""
        reply: replies.ForgetTenantReply = await self._request(
            "forget_tenant", commands.ForgetTenantCommand(), replies.ForgetTenantReply
        )
        return reply
