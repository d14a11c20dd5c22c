"""Rate limits in tokens per minute against an OpenAI-compatible server that enforces
its own (tests/openai_server.py: a strict 60 s window, 429 past it): with the limit set
(`runwire limit set openai:test-model --tpm N`), a saturated provider answers no 429 and
serves close to its limit; a run without room waits queued, holding no executor slot;
a provider tighter than the limit makes runs wait, not fail."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from runwire.contracts.status import RunStatus
from runwire.runners.openai_chat import OpenAISettings, make_runner
from runwire.testing.servers import Servers
from runwire.testing.waiting import eventually
from tests.openai_server import MINUTE_S, OpenAIServer, Stream, TokenLimit, text_answer
from tests.services import InProcessStack, collect

pytestmark = pytest.mark.integration

MODEL = "test-model"
# Each answer reports 200 tokens; each call may answer 400 (what it reserves): without
# settling what the calls used, a limit would serve about half of what it allows.
ANSWER_TOKENS = 190
PROMPT_TOKENS = 10
MAX_TOKENS = 400


def _input(i: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"question {i}"}],
        "max_tokens": MAX_TOKENS,
        **extra,
    }


def _answer() -> Stream:
    return Stream(
        text_answer("an ", "answer", prompt_tokens=PROMPT_TOKENS, completion_tokens=ANSWER_TOKENS)
    )


@asynccontextmanager
async def limited_stack(
    infra: Servers, db_url: str, prefix: str, server: OpenAIServer, **overrides: Any
) -> AsyncIterator[InProcessStack]:
    settings = OpenAISettings(base_url=server.base_url, api_key="sk-test-rate-limits")
    async with InProcessStack(
        infra.nats_url,
        db_url,
        prefix,
        overrides=overrides,
        runners={"openai": make_runner(settings)},
        db_roles=infra.service_roles,
    ) as stack:
        yield stack


async def test_a_saturated_provider_answers_no_429_and_serves_close_to_the_limit(
    infra: Servers, db_url: str, prefix: str
) -> None:
    tpm = 6000
    async with OpenAIServer() as server:
        server.default = lambda _request: _answer()
        server.limit = TokenLimit(tpm)
        # Two executor slots: runs waiting for room must not hold them.
        async with limited_stack(infra, db_url, prefix, server, max_in_flight=2) as stack:
            # The model's limit binds; the provider key's (much wider) is taken too.
            await stack.client.set_rate_limit("openai", tpm=100 * tpm, rpm=10_000)
            limits = await stack.client.set_rate_limit(f"openai:{MODEL}", tpm=tpm)
            assert [(x.key, x.tpm, x.rpm) for x in limits.limits] == [
                ("openai", 100 * tpm, 10_000),
                (f"openai:{MODEL}", tpm, None),
            ]
            # Demand for 9,000 tokens in the first minute: half again the limit.
            runs = [
                (await stack.client.submit(_input(i), runner="openai")).run.run_id
                for i in range(45)
            ]
            first = (await server.wait_for_requests(1))[0].at

            # While the calls wait for room, another runner's run gets a slot at once.
            async def some_wait() -> bool:
                listed = await stack.client.rate_limits()
                return listed.limits[1].waiting > 0

            await eventually(some_wait, timeout=30)
            other = await stack.client.submit({"tokens": ["not ", "held"]})
            _, other_text = await asyncio.wait_for(collect(stack.client, other.run.run_id), 10)
            assert other_text.text == "not held"
            # A waiting run says what it waits for.
            waiting = await eventually(lambda: _one_waiting(stack, runs), timeout=30)
            assert waiting.limit_key == f"openai:{MODEL}"
            assert waiting.not_before is not None

            async def tenant_sees_them() -> bool:
                return (await stack.client.budget()).rate_limited_runs > 0

            await eventually(tenant_sees_them, timeout=30)  # `runwire top` shows them

            # The minute of saturation ends when the next minute's first call arrives.
            await server.wait_for(lambda r: r.at >= first + MINUTE_S, timeout=MINUTE_S + 30)
            served = server.limit.tokens_in(first, first + MINUTE_S)
            assert server.limit.refused == 0, "the provider answered 429"
            assert served >= 0.9 * tpm, f"{served} tokens served in the minute, limit {tpm}"
            calls = sum(1 for r in server.requests if r.at < first + MINUTE_S)
            assert calls == served // (PROMPT_TOKENS + ANSWER_TOKENS)
            # None of the runs that waited had an attempt counted for it.
            done = [(await stack.client.get(run_id)) for run_id in runs]
            finished = [r for r in done if r.status == RunStatus.FINISHED]
            assert len(finished) >= calls - 2, [(r.status, r.attempts, r.error) for r in done]
            assert all(r.attempts == 1 for r in finished)
            for run_id in runs:
                await stack.client.cancel(run_id)


async def _one_waiting(stack: InProcessStack, runs: list[str]) -> Any:
    for run_id in reversed(runs):
        run = await stack.client.get(run_id)
        if run.queued_for == "rate_limit":
            return run
    return None


async def test_without_a_limit_the_same_burst_meets_429s(
    infra: Servers, db_url: str, prefix: str
) -> None:
    """The differential: what the limit spares a provider (and the runs) without it."""
    async with OpenAIServer() as server:
        server.default = lambda _request: _answer()
        server.limit = TokenLimit(1000)
        async with limited_stack(infra, db_url, prefix, server, max_in_flight=8) as stack:
            runs = [
                (await stack.client.submit(_input(i), runner="openai", max_attempts=1)).run.run_id
                for i in range(8)
            ]
            for run_id in runs:
                await collect(stack.client, run_id)
            ended = [await stack.client.get(run_id) for run_id in runs]
            assert server.limit.refused > 0
            failed = [r for r in ended if r.status == RunStatus.FAILED]
            assert failed
            assert all("429" in (r.error.message if r.error else "") for r in failed)


async def test_a_provider_tighter_than_the_limit_makes_runs_wait_not_fail(
    infra: Servers, db_url: str, prefix: str
) -> None:
    # The provider allows two answers a minute; runwire's limit thinks it has room for
    # fifty. The third call's 429 holds every call under the limit as long as the
    # provider asks, and its run waits for it: with one attempt allowed, it finishes.
    async with OpenAIServer() as server:
        server.default = lambda _request: _answer()
        server.limit = TokenLimit(2 * (PROMPT_TOKENS + ANSWER_TOKENS))
        async with limited_stack(infra, db_url, prefix, server, max_in_flight=8) as stack:
            await stack.client.set_rate_limit("openai", tpm=50 * (PROMPT_TOKENS + ANSWER_TOKENS))
            started = time.monotonic()
            runs = [
                (await stack.client.submit(_input(i), runner="openai", max_attempts=1)).run.run_id
                for i in range(3)
            ]
            for run_id in runs:
                await collect(stack.client, run_id, timeout=MINUTE_S + 30)
            ended = [await stack.client.get(run_id) for run_id in runs]
            assert [r.status for r in ended] == [RunStatus.FINISHED] * 3
            assert [r.attempts for r in ended] == [1, 1, 1]
            # At most the one 429 that taught the limit; the call after it waited a minute.
            assert server.limit.refused <= 1
            assert time.monotonic() - started >= MINUTE_S - 5
