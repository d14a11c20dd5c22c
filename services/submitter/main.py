"""The submitter as a FastStream application: `faststream run runwire.submitter.main:app`,
`runwire-submitter` or `python -m runwire.submitter`."""

import asyncio
from collections.abc import Mapping

from runwire.contracts import commands, replies
from runwire.runners.base import RunnerSpec
from runwire.runners.registry import RunnerConfigError, load_runners
from runwire.runtime import publications
from runwire.runtime.app import Service
from runwire.runtime.commands import Commands, tenant
from runwire.runtime.health import serve_health
from runwire.runtime.lifecycle import CannotStart, run
from runwire.runtime.settings import SubmitterSettings, from_env
from runwire.submitter.commands import Submitter
from runwire.submitter.jetstream import TenantJetStream
from runwire.submitter.runners import RunnerCatalog
from runwire.submitter.schedules import Schedules
from runwire.submitter.tenants import TenantLimits

QUEUE_GROUP = "submitter"


class SubmitterService(Service[SubmitterSettings]):
    """Answers submit, get, cancel and abort_session in the `submitter` queue group, and
    tenants' JetStream API requests (`jetstream.py`)."""

    name = "submitter"
    submitter: Submitter
    limits: TenantLimits
    schedules: Schedules
    jetstream: TenantJetStream

    def __init__(
        self,
        settings: SubmitterSettings,
        *,
        own_process: bool = True,
        runners: Mapping[str, object] | None = None,
    ) -> None:
        super().__init__(settings, own_process=own_process)
        self._given_runners = runners
        self.runners: dict[str, RunnerSpec] = {}
        self.catalog: RunnerCatalog | None = None
        command = Commands(self, QUEUE_GROUP)

        @command("submit", max_bytes=settings.max_input_bytes)
        async def submit(body: commands.SubmitCommand) -> replies.SubmitReply:
            """Submit a run. Submitting the same `request_id` again answers with the first
            run and `duplicate: true`."""
            return await self.submitter.submit(tenant(), body)

        @command("release", max_bytes=settings.max_input_bytes)
        async def release(body: commands.ReleaseCommand) -> replies.ReleaseReply:
            """Publish a workflow release: a graph of nodes under an id and a version, for
            good (the same id and version with another definition is refused)."""
            return await self.submitter.release(tenant(), body)

        @command("get", max_bytes=settings.max_input_bytes)
        async def get(body: commands.GetCommand) -> replies.RunReply:
            """Read a run's summary."""
            return await self.submitter.get(tenant(), body)

        @command("cancel", max_bytes=settings.max_input_bytes)
        async def cancel(body: commands.CancelCommand) -> replies.RunReply:
            """Cancel a run; a run that has ended already is answered unchanged."""
            return await self.submitter.cancel(tenant(), body)

        @command("resolve_effect", max_bytes=settings.max_input_bytes)
        async def resolve_effect(body: commands.ResolveEffectCommand) -> replies.RunReply:
            """Settle a side effect whose outcome runwire could not know (`unknown`, or
            `claimed` by an attempt that is gone): with its receipt, or its failure."""
            return await self.submitter.resolve_effect(tenant(), body)

        @command("set_budget", max_bytes=settings.max_input_bytes)
        async def set_budget(body: commands.SetBudgetCommand) -> replies.BudgetReply:
            """Set the tenant's budgets (tokens, cost units) and quotas (`null`: none)."""
            return await self.limits.set_budget(tenant(), body)

        @command("get_budget", max_bytes=settings.max_input_bytes)
        async def get_budget(body: commands.GetBudgetCommand) -> replies.BudgetReply:
            """Read the tenant's budgets, what its runs used and hold reserved."""
            return await self.limits.get_budget(tenant(), body)

        @command("set_policy", max_bytes=settings.max_input_bytes)
        async def set_policy(body: commands.SetPolicyCommand) -> replies.PolicyReply:
            """Set the effect kinds the tenant's runs may perform (`null`: every kind; a
            tenant without a policy may perform none); earlier runs' effect claims fail
            with AUTHORIZATION_STALE from now on."""
            return await self.limits.set_policy(tenant(), body)

        @command("get_policy", max_bytes=settings.max_input_bytes)
        async def get_policy(body: commands.GetPolicyCommand) -> replies.PolicyReply:
            """Read the tenant's policy."""
            return await self.limits.get_policy(tenant(), body)

        @command("set_rate_limit", max_bytes=settings.max_input_bytes)
        async def set_rate_limit(body: commands.SetRateLimitCommand) -> replies.RateLimitsReply:
            """An operator's: set a rate limit of a model provider's key or model (requests
            and tokens per minute, over every tenant; both null: remove it)."""
            return await self.limits.set_rate_limit(tenant(), body)

        @command("get_rate_limits", max_bytes=settings.max_input_bytes)
        async def get_rate_limits(body: commands.GetRateLimitsCommand) -> replies.RateLimitsReply:
            """Read the rate limits, what each holds of the last minute and the runs
            waiting for room."""
            return await self.limits.get_rate_limits(tenant(), body)

        @command("abort_session", max_bytes=settings.max_input_bytes)
        async def abort_session(body: commands.AbortSessionCommand) -> replies.AbortSessionReply:
            """Cancel every active and queued run of a session."""
            return await self.submitter.abort_session(tenant(), body)

        @command("end_tenant", max_bytes=settings.max_input_bytes)
        async def end_tenant(body: commands.EndTenantCommand) -> replies.EndTenantReply:
            """An operator's: cancel every active and queued run of the tenant."""
            return await self.submitter.end_tenant(tenant(), body)

        @command("list", max_bytes=settings.max_input_bytes)
        async def list_runs(body: commands.ListCommand) -> replies.ListReply:
            """The tenant's runs, newest first, a page at a time: by status, runner or
            session when given."""
            return await self.submitter.list_runs(tenant(), body)

        @command("reschedule", max_bytes=settings.max_input_bytes)
        async def reschedule(body: commands.RescheduleCommand) -> replies.RunReply:
            """Move the start of a run that waits without a job (a delayed run); refused
            with NOT_RESCHEDULABLE once it has its job."""
            return await self.submitter.reschedule(tenant(), body)

        @command("set_schedule", max_bytes=settings.max_input_bytes)
        async def set_schedule(body: commands.SetScheduleCommand) -> replies.SchedulesReply:
            """Create or replace a schedule: runs of a runner at the times of a cron
            expression in a time zone, each fire once."""
            return await self.schedules.set(tenant(), body)

        @command("remove_schedule", max_bytes=settings.max_input_bytes)
        async def remove_schedule(
            body: commands.RemoveScheduleCommand,
        ) -> replies.SchedulesReply:
            """Remove a schedule (its runs go on)."""
            return await self.schedules.remove(tenant(), body)

        @command("list_schedules", max_bytes=settings.max_input_bytes)
        async def list_schedules(body: commands.ListSchedulesCommand) -> replies.SchedulesReply:
            """The tenant's schedules."""
            return await self.schedules.list(tenant())

        @command("backfill_schedule", max_bytes=settings.max_input_bytes)
        async def backfill_schedule(
            body: commands.BackfillScheduleCommand,
        ) -> replies.SchedulesReply:
            """Make the runs of a schedule's fires in a past time range, each once."""
            return await self.schedules.backfill(tenant(), body)

        @command("set_webhooks", max_bytes=settings.max_input_bytes)
        async def set_webhooks(body: commands.SetWebhooksCommand) -> replies.WebhooksReply:
            """Replace the tenant's webhook endpoints; the first time (or with
            `rotate_secret`) the reply holds the secret deliveries are signed with."""
            return await self.limits.set_webhooks(tenant(), body)

        @command("get_webhooks", max_bytes=settings.max_input_bytes)
        async def get_webhooks(body: commands.GetWebhooksCommand) -> replies.WebhooksReply:
            """The tenant's webhook endpoints, deliveries pending and failed for good."""
            return await self.limits.get_webhooks(tenant(), body)

        @command("resume", max_bytes=settings.max_input_bytes)
        async def resume(body: commands.ResumeCommand) -> replies.ResumeReply:
            """Answer the interrupt a waiting run waits for: its next attempt is queued at
            once, and the runner's `ctx.interrupt` returns the value."""
            return await self.submitter.resume(tenant(), body)

        @command("signal", max_bytes=settings.max_input_bytes)
        async def signal(body: commands.SignalCommand) -> replies.SignalReply:
            """Send a run a signal: a wait of it for that name takes it now, or when the
            runner waits for it."""
            return await self.submitter.signal(tenant(), body)

        @command("forget_tenant", max_bytes=settings.max_input_bytes)
        async def forget_tenant(body: commands.ForgetTenantCommand) -> replies.ForgetTenantReply:
            """An operator's: delete what is kept of a removed tenant once no run of it is
            active (its runs, releases, budget and policy)."""
            return await self.submitter.forget_tenant(tenant(), body)

        serve_health(self)
        publications.jobs(self)
        publications.frames_out(self)

    def prepare(self) -> None:
        try:
            self.runners = load_runners(self.settings.runners, self._given_runners)
        except RunnerConfigError as exc:
            raise CannotStart(str(exc)) from exc

    def runner_names(self) -> list[str]:
        return self.catalog.names() if self.catalog is not None else sorted(self.runners)

    def loaded_runners(self) -> list[str]:
        return sorted(self.runners)

    async def work(self, stop: asyncio.Event) -> None:
        assert self.catalog is not None
        await self.jetstream.start()
        # What a tenant without its own share and queue capacity gets, for every service.
        await self.store.set_queue_defaults(
            self.settings.tenant_share_runs,
            self.settings.tenant_queue_capacity,
            self.settings.priority_max_wait_ms,
        )
        await self.catalog.keep_fresh(stop)

    def opened(self) -> None:
        self.catalog = RunnerCatalog(self.store, self.runners)
        self.submitter = Submitter(
            self.settings, self.store, self.broker, self.outbox, self.catalog
        )
        self.limits = TenantLimits(self.store)
        self.schedules = Schedules(self.settings, self.store, self.outbox)
        self.jetstream = TenantJetStream(self.settings, self.broker, QUEUE_GROUP)
        self.stopping.append(self.jetstream.stop)


service = SubmitterService(from_env(SubmitterSettings))
app = service.app


async def serve(
    settings: SubmitterSettings,
    stop: asyncio.Event,
    runners: Mapping[str, object] | None = None,
) -> None:
    """Serve the submitter's commands in this process until `stop` is set; `runners` are
    accepted beside those the entry points, the settings and the executors name."""
    await SubmitterService(settings, own_process=False, runners=runners).serve(stop)


def main() -> None:
    run(service)
