"""Budgets that are never overspent: reservations before costly calls, settlements with
what they used, many runs racing for the last tokens of a tenant."""

import asyncio
import uuid
from typing import Any

import asyncpg
import pytest

from runwire import ClientError
from runwire.contracts.errors import ErrorCode
from runwire.contracts.replies import RunBudget
from runwire.contracts.status import RunStatus
from runwire.runners.openai_chat import OpenAISettings, make_runner
from tests.openai_server import OpenAIServer, Stream, text_answer
from tests.runners import spend
from tests.services import InProcessStack, collect

pytestmark = pytest.mark.integration

HELLO = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20}


async def test_the_openai_runner_reserves_and_settles_each_model_call(
    infra: Any, db_url: str, prefix: str
) -> None:
    async with OpenAIServer() as server:
        runner = make_runner(OpenAISettings(base_url=server.base_url, api_key="sk-test"))
        # One attempt each, however busy the machine: a lease that outlives a slow tick.
        stack = InProcessStack(
            infra.nats_url,
            db_url,
            prefix,
            runners={"openai": runner},
            overrides={"lease_ttl_ms": 20_000},
        )
        async with stack:
            await stack.client.set_budget(tokens=10_000)
            server.queue(Stream(text_answer("Hi", " there", prompt_tokens=7)))
            fits = await stack.client.submit(HELLO, runner="openai", budget_tokens=100)
            await collect(stack.client, fits.run.run_id)
            # Its first call alone would need more than the run's budget.
            small = await stack.client.submit(HELLO, runner="openai", budget_tokens=5)
            await collect(stack.client, small.run.run_id)
            finished = await stack.client.get(fits.run.run_id)
            refused = await stack.client.get(small.run.run_id)
            budget = await stack.client.budget()

    assert finished.status == RunStatus.FINISHED
    assert (budget.tokens, budget.used, budget.reserved, budget.left) == (10_000, 9, 0, 9_991)
    # Each run shows its own budget and what it spent.
    assert finished.budget == RunBudget(tokens=100, tokens_used=9, calls=1)
    assert refused.budget == RunBudget(tokens=5)
    assert (refused.status, refused.attempts) == (RunStatus.FAILED, 1)
    assert refused.error is not None
    assert (refused.error.code, refused.error.retryable) == (ErrorCode.BUDGET_EXCEEDED, False)
    assert "the run has 5 tokens left" in refused.error.message
    assert len(server.requests) == 1  # the refused run never called the model


async def test_runs_racing_for_the_last_tokens_never_overspend_the_tenant(
    infra: Any, db_url: str, prefix: str
) -> None:
    async with InProcessStack(
        infra.nats_url, db_url, prefix, runners={"spend": spend}, executors=2
    ) as stack:
        await stack.client.set_budget(tokens=1000)
        replies = await asyncio.gather(
            *(stack.client.submit({"reserve": 60, "use": 40}, runner="spend") for _ in range(50))
        )
        await asyncio.gather(*(collect(stack.client, r.run.run_id) for r in replies))
        runs = [await stack.client.get(r.run.run_id) for r in replies]
        budget = await stack.client.budget()
        settled = [e for e in await stack.store.timeline() if e["event"] == "budget_settled"]

    finished = [r for r in runs if r.status == RunStatus.FINISHED]
    refused = [r for r in runs if r.status == RunStatus.FAILED]
    assert len(finished) + len(refused) == 50
    assert refused, "the budget ran out"
    assert all(r.error is not None and r.error.code == ErrorCode.BUDGET_EXCEEDED for r in refused)
    # Every finished run settled once (a run whose attempt was recovered after its
    # settlement may have been refused on the next one: its use still counts).
    assert len(settled) >= len(finished)
    assert budget.used == 40 * len(settled)
    assert budget.used <= 1000
    assert budget.reserved == 0


async def test_every_reservation_and_settlement_is_a_run_event(
    infra: Any, db_url: str, prefix: str
) -> None:
    async with InProcessStack(
        infra.nats_url, db_url, prefix, db_roles=infra.service_roles, runners={"spend": spend}
    ) as stack:
        reply = await stack.client.submit({"reserve": 60, "use": 40}, runner="spend")
        await collect(stack.client, reply.run.run_id)
        events = [e for e in await stack.store.timeline() if e["run_id"] == reply.run.run_id]

    budget = [(e["event"], e["reason"]) for e in events if e["event"].startswith("budget_")]
    assert budget == [
        ("budget_reserved", "g1:call: 60 tokens"),
        ("budget_settled", "g1:call: 40 of 60 tokens used"),
    ]


async def test_quotas_refuse_a_submit_and_create_nothing(
    infra: Any, db_url: str, prefix: str
) -> None:
    async with InProcessStack(
        infra.nats_url, db_url, prefix, db_roles=infra.service_roles
    ) as stack:
        await stack.client.set_budget(max_active_runs=2)
        slow = {"tokens": ["a"] * 100, "token_delay_ms": 20}
        first = [await stack.client.submit(slow) for _ in range(2)]
        with pytest.raises(ClientError) as busy:
            await stack.client.submit(slow, request_id="third")
        state = await stack.client.budget()
        for reply in first:
            await collect(stack.client, reply.run.run_id)
        # Room again once they ended; then the daily quota: 3 runs today already.
        await stack.client.submit({"tokens": ["b"]})
        await stack.client.set_budget(max_active_runs=None, max_runs_per_day=3)
        with pytest.raises(ClientError) as daily:
            await stack.client.submit({"tokens": ["c"]})
        refused_run = await stack.store.run_by_request("default", "third")
        final = await stack.client.budget()

    assert (busy.value.code, busy.value.retryable) == (ErrorCode.QUOTA_EXCEEDED, False)
    assert refused_run is None  # nothing was created
    assert "2 active runs; its quota is 2" in busy.value.message
    assert (state.max_active_runs, state.active_runs) == (2, 2)
    assert daily.value.code == ErrorCode.QUOTA_EXCEEDED
    assert "3 runs today" in daily.value.message
    assert (final.max_active_runs, final.max_runs_per_day, final.runs_today) == (None, 3, 3)


async def test_cost_units_are_a_budget_beside_tokens(infra: Any, db_url: str, prefix: str) -> None:
    # A lease a busy machine does not lose: a second attempt would reserve again.
    async with InProcessStack(
        infra.nats_url,
        db_url,
        prefix,
        overrides={"lease_ttl_ms": 30_000},
        db_roles=infra.service_roles,
        runners={"spend": spend},
    ) as stack:
        await stack.client.set_budget(cost=100)  # no token limit: only cost units count
        runs = []
        for _ in range(4):
            reply = await stack.client.submit(
                {"reserve": 5000, "use": 5000, "reserve_cost": 40, "use_cost": 30},
                runner="spend",
            )
            await collect(stack.client, reply.run.run_id)
            runs.append(await stack.client.get(reply.run.run_id))
        # A run's own cost budget, smaller than what the tenant has left.
        small = await stack.client.submit(
            {"reserve": 1, "use": 1, "reserve_cost": 9, "use_cost": 9},
            runner="spend",
            budget_cost=8,
        )
        await collect(stack.client, small.run.run_id)
        refused_small = await stack.client.get(small.run.run_id)
        budget = await stack.client.budget()

    # 30 + 30 + 30 settled; the fourth run's 40 does not fit the 10 left.
    assert [r.status for r in runs] == [RunStatus.FINISHED] * 3 + [RunStatus.FAILED]
    last = runs[-1].error
    assert last is not None
    assert last.code == ErrorCode.BUDGET_EXCEEDED
    assert "the tenant has 10 cost units left" in last.message
    assert refused_small.error is not None
    assert "the run has 8 cost units left" in refused_small.error.message
    assert (budget.cost, budget.cost_used, budget.cost_reserved, budget.cost_left) == (
        100,
        90,
        0,
        10,
    )
    assert (budget.tokens, budget.used, budget.left) == (None, 15_000, None)


async def test_the_openai_runner_prices_each_call_in_cost_units(
    infra: Any, db_url: str, prefix: str
) -> None:
    async with OpenAIServer() as server:
        settings = OpenAISettings(
            base_url=server.base_url,
            api_key="sk-test",
            input_cost_per_million=1_000_000,  # a cost unit per prompt token
            output_cost_per_million=3_000_000,  # three per answer token
        )
        stack = InProcessStack(
            infra.nats_url, db_url, prefix, runners={"openai": make_runner(settings)}
        )
        async with stack:
            await stack.client.set_budget(cost=1000)
            server.queue(Stream(text_answer("Hi", " there", prompt_tokens=7)))
            reply = await stack.client.submit(HELLO, runner="openai")
            await collect(stack.client, reply.run.run_id)
            finished = await stack.client.get(reply.run.run_id)
            # 20 answer tokens at most would cost 60 alone: more than this run may spend.
            refused = await stack.client.submit(HELLO, runner="openai", budget_cost=50)
            await collect(stack.client, refused.run.run_id)
            refused_run = await stack.client.get(refused.run.run_id)
            budget = await stack.client.budget()

    assert finished.status == RunStatus.FINISHED
    # text_answer's usage: 7 prompt tokens and 2 answer tokens: 7 + 2 * 3.
    assert (budget.cost_used, budget.cost_reserved) == (13, 0)
    assert refused_run.error is not None
    assert refused_run.error.code == ErrorCode.BUDGET_EXCEEDED
    assert "cost units" in refused_run.error.message
    assert len(server.requests) == 1


async def test_a_model_call_cut_short_is_charged_what_it_reserved(
    infra: Any, db_url: str, prefix: str
) -> None:
    async with OpenAIServer() as server:
        runner = make_runner(OpenAISettings(base_url=server.base_url, api_key="sk-test"))
        stack = InProcessStack(
            infra.nats_url,
            db_url,
            prefix,
            runners={"openai": runner},
            overrides={"lease_ttl_ms": 20_000},
        )
        async with stack:
            await stack.client.set_budget(tokens=10_000)
            # The connection drops mid-answer: the provider may well bill the call.
            server.queue(
                Stream(text_answer("Once", " upon", " a", " time"), cut_after=3),
                Stream(text_answer(" a", " time", prompt_tokens=7)),
            )
            reply = await stack.client.submit(HELLO, runner="openai")
            await collect(stack.client, reply.run.run_id)
            run = await stack.client.get(reply.run.run_id)
            budget = await stack.client.budget()
            conn = await asyncpg.connect(db_url)
            try:
                rows = await conn.fetch(
                    "SELECT key, tokens, used FROM budget_reservations WHERE run_id = $1"
                    " ORDER BY key",
                    uuid.UUID(reply.run.run_id),
                )
            finally:
                await conn.close()

    assert (run.status, run.attempts) == (RunStatus.FINISHED, 2)
    cut, answered = ((r["key"], r["tokens"], r["used"]) for r in rows)
    # The cut call: what was reserved (its prompt's size plus max_tokens); the next: usage.
    assert cut[0].endswith(":model-call-1")
    assert cut[1] > 20
    assert cut[2] == cut[1]
    assert answered[2] == 7 + 2
    assert (budget.used, budget.reserved) == (cut[1] + 9, 0)
