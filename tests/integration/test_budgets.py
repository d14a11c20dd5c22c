"""Budgets that are never overspent: reservations before costly calls, settlements with
what they used, many runs racing for the last tokens of a tenant."""

import asyncio
from typing import Any

import pytest

from runwire.contracts.errors import ErrorCode
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
        stack = InProcessStack(infra.nats_url, db_url, prefix, runners={"openai": runner})
        async with stack:
            await stack.client.set_budget(10_000)
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
    assert (refused.status, refused.attempts) == (RunStatus.FAILED, 1)
    assert refused.error is not None
    assert (refused.error.code, refused.error.retryable) == (ErrorCode.BUDGET_EXCEEDED, False)
    assert "the run has 5 left" in refused.error.message
    assert len(server.requests) == 1  # the refused run never called the model


async def test_runs_racing_for_the_last_tokens_never_overspend_the_tenant(
    infra: Any, db_url: str, prefix: str
) -> None:
    async with InProcessStack(
        infra.nats_url, db_url, prefix, runners={"spend": spend}, executors=2
    ) as stack:
        await stack.client.set_budget(1000)
        replies = await asyncio.gather(
            *(stack.client.submit({"reserve": 60, "use": 40}, runner="spend") for _ in range(50))
        )
        await asyncio.gather(*(collect(stack.client, r.run.run_id) for r in replies))
        runs = [await stack.client.get(r.run.run_id) for r in replies]
        budget = await stack.client.budget()

    finished = [r for r in runs if r.status == RunStatus.FINISHED]
    refused = [r for r in runs if r.status == RunStatus.FAILED]
    assert len(finished) + len(refused) == 50
    assert refused, "the budget ran out"
    assert all(r.error is not None and r.error.code == ErrorCode.BUDGET_EXCEEDED for r in refused)
    assert budget.used == 40 * len(finished)
    assert budget.used <= 1000
    assert budget.reserved == 0
