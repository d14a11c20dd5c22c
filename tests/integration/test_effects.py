"""Side effects through the fence: performed once across attempts, shown as frames,
refusals fail the run (a real HTTP endpoint that counts charges per idempotency key)."""

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from pydantic import ValidationError

from runwire import ClientError
from runwire.contracts.errors import ErrorCode
from runwire.contracts.frames import FrameType
from runwire.contracts.status import RunStatus
from tests.effect_server import EffectServer
from tests.runners import GATES, MAIL_API, charge, mailer, send_email
from tests.services import InProcessStack, collect, eventually

pytestmark = pytest.mark.integration


def _charge(server: EffectServer, **extra: Any) -> dict[str, Any]:
    return {
        "url": f"{server.url}/charge",
        "status_url": f"{server.url}/charges/{{idempotency_key}}",
        "amount": 40,
        **extra,
    }


@contextlib.asynccontextmanager
async def _charging(
    infra: Any, db_url: str, prefix: str, **options: Any
) -> AsyncIterator[tuple[EffectServer, InProcessStack]]:
    """A payment endpoint, and the stack with the `charge` runner (and `options`), whose
    tenant may perform http effects."""
    async with (
        EffectServer() as server,
        InProcessStack(
            infra.nats_url,
            db_url,
            prefix,
            db_roles=infra.service_roles,
            runners={"charge": charge},
            **options,
        ) as stack,
    ):
        await stack.allow_effects("http")
        yield server, stack


async def _effects(db_url: str, run_id: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(db_url)
    try:
        return list(await conn.fetch("SELECT * FROM effects WHERE run_id = $1", run_id))
    finally:
        await conn.close()


async def test_an_effect_is_dispatched_once_and_its_steps_are_frames(
    infra: Any, db_url: str, prefix: str
) -> None:
    async with _charging(infra, db_url, prefix) as (server, stack):
        reply = await stack.client.submit(_charge(server), runner="charge")
        frames, transcript = await collect(stack.client, reply.run.run_id)
        run = await stack.client.get(reply.run.run_id)
        (row,) = await _effects(db_url, reply.run.run_id)

    assert run.status == RunStatus.FINISHED
    assert transcript.text == "charged 40 as ch_1"
    assert list(server.charges.values()) == [1]
    steps = [f.data for f in frames if f.type == FrameType.EFFECT]
    assert [s["state"] for s in steps] == ["prepared", "claimed", "committed"]
    assert steps[-1]["receipt_id"] == "ch_1"
    assert (steps[-1]["key"], steps[-1]["kind"]) == ("charge", "http")
    assert (row["state"], row["fence"]) == ("committed", 1)
    # The status and the id only: not the rest of what the endpoint answered.
    assert json.loads(row["receipt"]) == {"status": 200, "id": "ch_1"}


async def test_a_retried_attempt_gets_the_stored_receipt_and_charges_nothing(
    infra: Any, db_url: str, prefix: str
) -> None:
    async with _charging(infra, db_url, prefix) as (server, stack):
        script = _charge(server, fail_after_charge_on_attempt=1)
        reply = await stack.client.submit(script, runner="charge")
        frames, transcript = await collect(stack.client, reply.run.run_id)
        run = await stack.client.get(reply.run.run_id)

    assert (run.status, run.attempts) == (RunStatus.FINISHED, 2)
    assert transcript.text == "charged 40 as ch_1"
    assert list(server.charges.values()) == [1]
    # The second attempt's effect is already committed: no claim, no dispatch.
    states = [f.data["state"] for f in frames if f.type == FrameType.EFFECT]
    assert states == ["prepared", "claimed", "committed"]


async def test_a_refused_effect_fails_the_run_with_effect_failed(
    infra: Any, db_url: str, prefix: str
) -> None:
    async with _charging(infra, db_url, prefix) as (server, stack):
        reply = await stack.client.submit(_charge(server, amount=5000), runner="charge")
        frames, _ = await collect(stack.client, reply.run.run_id)
        run = await stack.client.get(reply.run.run_id)
        (row,) = await _effects(db_url, reply.run.run_id)

    assert (run.status, run.attempts) == (RunStatus.FAILED, 1)
    assert run.error is not None
    assert run.error.code == ErrorCode.EFFECT_FAILED
    # The status code, never the endpoint's body.
    assert "HTTP 402" in run.error.message
    assert "card declined" not in run.error.message
    assert row["state"] == "failed"
    assert [f.data["state"] for f in frames if f.type == FrameType.EFFECT][-1] == "failed"


async def test_a_dispatch_past_its_deadline_fails_the_effect_once(
    infra: Any, db_url: str, prefix: str
) -> None:
    async with _charging(infra, db_url, prefix, overrides={"effect_claim_ms": 500}) as (
        server,
        stack,
    ):
        server.hold = True
        reply = await stack.client.submit(_charge(server), runner="charge")
        frames, _ = await collect(stack.client, reply.run.run_id)
        run = await stack.client.get(reply.run.run_id)

    assert (run.status, run.attempts) == (RunStatus.FAILED, 1)
    assert run.error is not None
    assert (run.error.code, run.error.retryable) == (ErrorCode.EFFECT_DEADLINE_EXCEEDED, False)
    assert [(e.key, e.state) for e in run.effects] == [("charge", "failed")]
    assert [f.data["state"] for f in frames if f.type == FrameType.EFFECT][-1] == "failed"


async def test_an_unknown_effect_shows_in_get_and_an_operator_resolves_it(
    infra: Any, db_url: str, prefix: str
) -> None:
    async with _charging(infra, db_url, prefix) as (server, stack):
        server.fail_with = 503  # the outcome cannot be known, and there is no status URL
        script = {"url": f"{server.url}/charge", "amount": 40}
        reply = await stack.client.submit(script, runner="charge", max_attempts=1)
        frames, _ = await collect(stack.client, reply.run.run_id)
        run_id = reply.run.run_id
        seen = await stack.client.get(run_id)
        resolved = await stack.client.resolve_effect(run_id, "charge", receipt={"id": "ch_manual"})
        with pytest.raises(ClientError) as again:
            await stack.client.resolve_effect(run_id, "charge", error="never mind")
        with pytest.raises(ClientError) as missing:
            await stack.client.resolve_effect(run_id, "refund", error="no")
        with pytest.raises(ValidationError):
            await stack.client.resolve_effect(run_id, "charge")

    assert [(e.key, e.state) for e in seen.effects] == [("charge", "unknown")]
    assert [f.data["state"] for f in frames if f.type == FrameType.EFFECT][-1] == "unknown"
    assert [(e.state, e.receipt_id) for e in resolved.effects] == [("reconciled", "ch_manual")]
    assert (again.value.code, again.value.retryable) == (ErrorCode.INVALID_REQUEST, False)
    assert "reconciled" in again.value.message
    assert missing.value.code == ErrorCode.NOT_FOUND


async def test_a_costly_effect_reserves_its_cost_and_is_refused_before_dispatch(
    infra: Any, db_url: str, prefix: str
) -> None:
    async with _charging(infra, db_url, prefix) as (server, stack):
        await stack.client.set_budget(cost=50)
        paid = await stack.client.submit(_charge(server, cost=30), runner="charge")
        await collect(stack.client, paid.run.run_id)
        after_paid = await stack.client.budget()
        # Declined by the provider: it did not happen, so its 15 units come back.
        declined = await stack.client.submit(_charge(server, amount=5000, cost=15), runner="charge")
        await collect(stack.client, declined.run.run_id)
        after_declined = await stack.client.budget()
        # 30 spent of 50: a charge that costs 30 does not fit, and is never dispatched.
        over = await stack.client.submit(_charge(server, cost=30), runner="charge")
        await collect(stack.client, over.run.run_id)
        refused = await stack.client.get(over.run.run_id)
        final = await stack.client.budget()

    assert list(server.charges.values()) == [1]  # only the first charge happened
    assert (after_paid.cost_used, after_paid.cost_reserved) == (30, 0)
    assert (after_declined.cost_used, after_declined.cost_reserved) == (30, 0)
    assert refused.status == RunStatus.FAILED
    assert refused.error is not None
    assert (refused.error.code, refused.error.retryable) == (ErrorCode.BUDGET_EXCEEDED, False)
    assert "effect 'charge' needs 0 tokens and 30 cost units" in refused.error.message
    assert "the tenant has 20 cost units left" in refused.error.message
    assert refused.effects == []  # nothing was prepared
    assert (final.cost_used, final.cost_left) == (30, 20)


async def test_a_claim_after_the_tenants_policy_changed_fails_authorization_stale(
    infra: Any, db_url: str, prefix: str
) -> None:
    gate = GATES[prefix] = asyncio.Event()
    async with _charging(infra, db_url, prefix) as (server, stack):
        reply = await stack.client.submit(_charge(server, gate=prefix), runner="charge")
        run_id = reply.run.run_id
        # Its attempt waits at the gate, before the effect.
        await eventually(lambda: _running(stack, run_id), timeout=20)
        policy = await stack.client.set_policy(effects=["http", "noop"])
        gate.set()
        frames, _ = await collect(stack.client, run_id)
        stale = await stack.client.get(run_id)
        # A run submitted under the new policy holds a fresh authorization.
        fresh = await stack.client.submit(_charge(server), runner="charge")
        await collect(stack.client, fresh.run.run_id)
        later = await stack.client.get(fresh.run.run_id)
        events = [e for e in await stack.store.timeline() if e["run_id"] == run_id]

    assert (policy.effects, policy.version) == (["http", "noop"], 2)
    assert stale.status == RunStatus.FAILED
    assert stale.error is not None
    assert (stale.error.code, stale.error.retryable) == (ErrorCode.AUTHORIZATION_STALE, False)
    assert [(e.key, e.state) for e in stale.effects] == [("charge", "failed")]
    # Prepared, then failed at its claim: never claimed, never dispatched.
    assert [f.data["state"] for f in frames if f.type == FrameType.EFFECT] == [
        "prepared",
        "failed",
    ]
    assert later.status == RunStatus.FINISHED
    assert sum(server.charges.values()) == 1  # the fresh run's charge only
    assert [e["event"] for e in events][-1] == "failed"


async def _running(stack: InProcessStack, run_id: str) -> bool:
    return (await stack.client.get(run_id)).status == RunStatus.RUNNING


async def test_effects_a_run_or_its_tenant_does_not_permit_are_refused(
    infra: Any, db_url: str, prefix: str
) -> None:
    async with _charging(infra, db_url, prefix) as (server, stack):
        # The run itself may only perform noop effects.
        own = await stack.client.submit(_charge(server), runner="charge", effects=["noop"])
        await collect(stack.client, own.run.run_id)
        by_run = await stack.client.get(own.run.run_id)
        # The tenant's policy allows no http effects (set before the submit: not stale).
        await stack.client.set_policy(effects=["noop"])
        tenant = await stack.client.submit(_charge(server), runner="charge")
        await collect(stack.client, tenant.run.run_id)
        by_policy = await stack.client.get(tenant.run.run_id)
        with pytest.raises(ValidationError):
            await stack.client.submit(_charge(server), runner="charge", effects=["Not A Kind"])
        unset = await stack.client.set_policy(effects=None)

    assert not server.charges
    for run in (by_run, by_policy):
        assert run.status == RunStatus.FAILED
        assert run.error is not None
        assert (run.error.code, run.error.retryable) == (ErrorCode.EFFECT_FAILED, False)
        assert "may not perform effects of kind 'http'" in run.error.message
    assert (unset.effects, unset.version) == (None, 3)


async def test_a_tools_effect_happens_once_per_call_whatever_the_retries(
    infra: Any, db_url: str, prefix: str
) -> None:
    async with EffectServer() as server:
        MAIL_API["url"] = server.url
        async with InProcessStack(
            infra.nats_url,
            db_url,
            prefix,
            runners={"mailer": mailer},
            tools={"send_email": send_email},
        ) as stack:
            await stack.allow_effects("http")
            await stack.client.set_budget(cost=10)
            script = {
                "to": "ada@example.com",
                "calls": ["welcome", "reminder"],
                "fail_on_attempt": 1,
            }
            reply = await stack.client.submit(script, runner="mailer")
            frames, transcript = await collect(stack.client, reply.run.run_id)
            run = await stack.client.get(reply.run.run_id)
            budget = await stack.client.budget()

    assert (run.status, run.attempts) == (RunStatus.FINISHED, 2)
    # Two calls, two emails, each sent once although both attempts made both calls.
    assert sorted(server.emails.values()) == [1, 1]
    assert transcript.text == "em_1 em_2"
    assert [server.sent[r]["subject"] for r in ("em_1", "em_2")] == [
        "hello (welcome)",
        "hello (reminder)",
    ]
    results = [f.data for f in frames if f.type == FrameType.TOOL_RESULT]
    assert [r["output"] for r in results] == [{"sent": "em_1"}, {"sent": "em_2"}] * 2
    assert sorted(e.key for e in run.effects) == ["reminder:email", "welcome:email"]
    assert budget.cost_used == 2  # one cost unit per email, not per attempt


async def test_an_effect_whose_outcome_is_pending_makes_the_run_wait_not_retry(
    infra: Any, db_url: str, prefix: str
) -> None:
    """The charge's answer is lost; its status says pending three times: the run waits
    on a timer (no worker held, no attempt spent), twice, asking again each time, and
    finishes within two attempts, charged once."""
    async with _charging(
        infra, db_url, prefix, overrides={"effect_pending_wait_s": 0.3, "retry_base_ms": 10}
    ) as (server, stack):
        server.lose_answers = 1
        server.pending_status = 3
        reply = await stack.client.submit(_charge(server), runner="charge", max_attempts=2)
        run_id = reply.run.run_id

        async def waiting() -> Any:
            run = await stack.client.get(run_id)
            return run if run.status == RunStatus.WAITING else None

        waits = await eventually(waiting, timeout=20)
        frames, transcript = await collect(stack.client, run_id)
        run = await stack.client.get(run_id)
    assert waits.waiting_for is not None
    assert waits.waiting_for.kind == "sleep"
    assert waits.waiting_for.payload == {"effect": "charge", "status": "pending"}
    assert run.status == RunStatus.FINISHED, run.error
    assert transcript.text == "charged 40 as ch_1"
    assert list(server.charges.values()) == [1]
    assert server.pending_status == 0
    assert [f.data["kind"] for f in frames if f.type == FrameType.WAIT] == ["sleep", "sleep"]
