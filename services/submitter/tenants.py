"""A tenant's limits, policy and webhooks: its budget, quotas, share of executor slots
and queue (`set_budget`, `get_budget`) and the effect kinds its runs may perform
(`set_policy`, `get_policy`), as an operator sets them; the endpoints its runs' webhooks
go to (`set_webhooks`, `get_webhooks`), as the tenant sets them. And the rate limits
of model providers, which every tenant shares (`set_rate_limit`, `get_rate_limits`), as
an operator sets them."""

import logging

from runwire.contracts import commands, replies
from runwire.contracts.webhooks import WebhookEndpoint, WebhookFailure
from runwire.runtime.logs import fields
from runwire.runtime.store import Store
from runwire.runtime.webhook_signing import new_secret

log = logging.getLogger(__name__)

# Failed deliveries a `get_webhooks` reply shows, newest first.
SHOWN_FAILURES = 20


class TenantLimits:
    """The commands on a tenant's limits and policy."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def set_budget(self, tenant: str, cmd: commands.SetBudgetCommand) -> replies.BudgetReply:
        limits = {name: getattr(cmd, name) for name in cmd.model_fields_set if name != "v"}
        await self.store.set_tenant_budget(tenant, limits)
        log.info("budget set", extra=fields(tenant=tenant, **limits))
        return await self.get_budget(tenant, commands.GetBudgetCommand())

    async def get_budget(self, tenant: str, cmd: commands.GetBudgetCommand) -> replies.BudgetReply:
        state = await self.store.tenant_budget(tenant)

        def left(limit: int | None, spent: int) -> int | None:
            return None if limit is None else limit - spent

        return replies.BudgetReply(
            tenant=tenant,
            tokens=state["tokens"],
            used=state["spent"] - state["reserved"],
            reserved=state["reserved"],
            left=left(state["tokens"], state["spent"]),
            cost=state["cost"],
            cost_used=state["cost_spent"] - state["cost_reserved"],
            cost_reserved=state["cost_reserved"],
            cost_left=left(state["cost"], state["cost_spent"]),
            max_active_runs=state["max_active_runs"],
            max_runs_per_day=state["max_runs_per_day"],
            active_runs=state["active_runs"],
            runs_today=state["runs_today"],
            share=state["share"],
            share_runs=state["share_runs"],
            issued_runs=state["issued_runs"],
            max_queued_runs=state["max_queued_runs"],
            queued_runs=state["queued_runs"],
            rate_limited_runs=state["rate_limited_runs"],
            max_runs_per_key=state["max_runs_per_key"],
        )

    async def set_policy(self, tenant: str, cmd: commands.SetPolicyCommand) -> replies.PolicyReply:
        await self.store.set_tenant_policy(tenant, cmd.effects)
        log.warning(
            "policy set: runs submitted before hold a stale authorization",
            extra=fields(tenant=tenant, effects=cmd.effects),
        )
        return await self.get_policy(tenant, commands.GetPolicyCommand())

    async def get_policy(self, tenant: str, cmd: commands.GetPolicyCommand) -> replies.PolicyReply:
        effects, version = await self.store.tenant_policy(tenant)
        return replies.PolicyReply(tenant=tenant, effects=effects, version=version)

    async def set_webhooks(
        self, tenant: str, cmd: commands.SetWebhooksCommand
    ) -> replies.WebhooksReply:
        endpoints = [(e.url, [str(k) for k in e.events]) for e in cmd.endpoints]
        made = await self.store.set_webhooks(tenant, endpoints, new_secret(), cmd.rotate_secret)
        log.info(
            "webhooks set",
            extra=fields(tenant=tenant, endpoints=len(endpoints), new_secret=made is not None),
        )
        reply = await self.get_webhooks(tenant, commands.GetWebhooksCommand())
        return reply.model_copy(update={"secret": made})

    async def get_webhooks(
        self, tenant: str, cmd: commands.GetWebhooksCommand
    ) -> replies.WebhooksReply:
        state = await self.store.webhooks_of(tenant, SHOWN_FAILURES)
        return replies.WebhooksReply(
            tenant=tenant,
            endpoints=[WebhookEndpoint.model_validate(e) for e in state["endpoints"]],
            pending=state["pending"],
            failed=[WebhookFailure.model_validate(f) for f in state["failed"]],
        )

    async def set_rate_limit(
        self, tenant: str, cmd: commands.SetRateLimitCommand
    ) -> replies.RateLimitsReply:
        if cmd.rpm is None and cmd.tpm is None:
            removed = await self.store.remove_rate_limit(cmd.key)
            log.info("rate limit removed", extra=fields(limit=cmd.key, removed=removed))
        else:
            await self.store.set_rate_limit(cmd.key, cmd.rpm, cmd.tpm)
            log.info("rate limit set", extra=fields(limit=cmd.key, rpm=cmd.rpm, tpm=cmd.tpm))
        return await self.get_rate_limits(tenant, commands.GetRateLimitsCommand())

    async def get_rate_limits(
        self, tenant: str, cmd: commands.GetRateLimitsCommand
    ) -> replies.RateLimitsReply:
        del tenant, cmd  # the limits are every tenant's
        return replies.RateLimitsReply(
            limits=[
                replies.RateLimitData(
                    key=r.key,
                    rpm=r.rpm,
                    tpm=r.tpm,
                    requests=r.requests,
                    tokens=r.tokens,
                    waiting=r.waiting,
                )
                for r in await self.store.rate_limits()
            ]
        )
