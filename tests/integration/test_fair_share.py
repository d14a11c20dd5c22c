"""Fair share among tenants: one tenant's flood neither keeps another's runs waiting
behind it nor refuses another's submits; an operator's weights divide the executors'
slots."""

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from runwire import Client, ClientError
from runwire.contracts.errors import ErrorCode
from runwire.contracts.frames import FrameType
from runwire.testing.waiting import pace
from tests.services import InProcessStack, collect, eventually, max_running

pytestmark = pytest.mark.integration

# Each run holds a slot for about this long.
SLOW = {"tokens": ["x"], "token_delay_ms": 150}
QUICK = {"tokens": ["ok"]}


@asynccontextmanager
async def tenant(stack: InProcessStack, name: str) -> AsyncIterator[Client]:
    async with await Client.connect(stack.nats_url, prefix=stack.prefix, tenant=name) as client:
        yield client


async def flood(client: Client, runs: int, body: dict[str, Any]) -> list[str]:
    replies = await asyncio.gather(*(client.submit(body) for _ in range(runs)))
    return [r.run.run_id for r in replies]


async def waited_s(stack: InProcessStack, run_id: str) -> float:
    """How long the run waited from its submit to its first attempt."""
    events = await stack.store.run_events(run_id)
    at = {e["event"]: e["at"] for e in reversed(events)}
    return float((at["claimed"] - at["submitted"]).total_seconds())


async def test_a_tenants_flood_neither_delays_nor_refuses_another_tenant(
    infra: Any, db_url: str, prefix: str
) -> None:
    overrides = {"max_in_flight": 4, "tenant_share_runs": 4}
    async with (
        InProcessStack(
            infra.nats_url, db_url, prefix, db_roles=infra.service_roles, overrides=overrides
        ) as stack,
        tenant(stack, "acme") as acme,
        tenant(stack, "globex") as globex,
    ):
        flooded = await flood(acme, 400, SLOW)
        # Every slot is acme's, and almost all of its runs still wait.
        await eventually(lambda: _issued(acme, 4), timeout=20)
        theirs = [(await globex.submit(QUICK)).run.run_id for _ in range(10)]
        for run_id in theirs:
            await collect(globex, run_id)
        waits = [await waited_s(stack, run_id) for run_id in theirs]
        left = await acme.budget()
        # Without a share, globex's runs waited behind acme's 400 (15 s at 4 slots).
        assert max(waits) < 1.0, waits
        assert left.queued_runs > 300
        assert (left.share_runs, left.issued_runs) == (4, 4)

        # acme at its own queue's capacity (an operator's): refused, globex accepted.
        capped = await acme.set_budget(max_queued_runs=left.queued_runs // 2)
        assert capped.max_queued_runs == left.queued_runs // 2
        with pytest.raises(ClientError) as refused:
            await acme.submit(QUICK)
        assert (refused.value.code, refused.value.retryable) == (ErrorCode.QUEUE_FULL, True)
        assert "tenant acme has" in refused.value.message
        accepted = await globex.submit(QUICK)
        await collect(globex, accepted.run.run_id)
        # Held runs are runs like any other: canceled, each ends with `done`.
        for run_id in flooded[-3:]:
            await acme.cancel(run_id)
            frames, _ = await collect(acme, run_id)
            assert frames[-1].type == FrameType.DONE


async def _issued(client: Client, runs: int) -> bool:
    return (await client.budget()).issued_runs == runs


async def test_weights_divide_the_slots_between_busy_tenants(
    infra: Any, db_url: str, prefix: str
) -> None:
    overrides = {"max_in_flight": 4, "tenant_share_runs": 1}
    async with (
        InProcessStack(
            infra.nats_url, db_url, prefix, db_roles=infra.service_roles, overrides=overrides
        ) as stack,
        tenant(stack, "acme") as acme,
        tenant(stack, "globex") as globex,
    ):
        await acme.set_budget(share=3)
        # acme floods first: without shares, globex's runs would all wait for its 150.
        heavy = await flood(acme, 150, SLOW)
        light = await flood(globex, 40, SLOW)
        for run_id in light:
            await collect(globex, run_id)
        timeline = await stack.store.timeline()
        left = await acme.budget()
    theirs = set(light)
    ours = set(heavy)
    claims = [e["run_id"] for e in timeline if e["event"] == "claimed"]
    # From globex's first claim to its last, both tenants were busy.
    first = next(i for i, r in enumerate(claims) if r in theirs)
    last = max(i for i, r in enumerate(claims) if r in theirs)
    window = claims[first : last + 1]
    share = sum(r in ours for r in window) / sum(r in theirs for r in window)
    assert 2.0 <= share <= 4.5, share
    assert left.queued_runs > 0  # acme was still busy when globex was done


async def test_a_share_raised_by_the_operator_issues_the_held_runs_at_once(
    infra: Any, db_url: str, prefix: str
) -> None:
    # No executor: nothing ends, so only the share decides what holds a job.
    overrides = {"tenant_share_runs": 1}
    async with InProcessStack(
        infra.nats_url,
        db_url,
        prefix,
        db_roles=infra.service_roles,
        overrides=overrides,
        executors=0,
    ) as stack:
        # One after another: submits at the same moment may each see the share's last
        # room (it is exceeded by that much, see start_share_turn).
        runs = [(await stack.client.submit(QUICK)).run.run_id for _ in range(5)]
        before = await stack.client.budget()
        await stack.client.set_budget(share=3)
        await eventually(lambda: _issued(stack.client, 3), timeout=10)
        events = {run_id: await stack.store.run_events(run_id) for run_id in runs}
    assert (before.share_runs, before.issued_runs, before.queued_runs) == (1, 1, 5)
    turns = [r for r, evs in events.items() if any(e["event"] == "share_turn" for e in evs)]
    assert len(turns) == 2
    held = [r for r, evs in events.items() if evs[0]["reason"].endswith("its tenant's share")]
    assert len(held) == 4


async def _turns(stack: InProcessStack, runs: list[str]) -> list[str]:
    """The runs of `runs` that got their job from their tenant's share, in that order."""
    timeline = await stack.store.timeline()
    return [e["run_id"] for e in timeline if e["event"] == "share_turn" and e["run_id"] in runs]


async def test_waiting_runs_start_by_priority_and_age_counts(
    infra: Any, db_url: str, prefix: str
) -> None:
    # No executor, a share of one job: a cancel is what makes room, one run at a time.
    overrides = {"tenant_share_runs": 1, "priority_max_wait_ms": 2_000}
    async with InProcessStack(
        infra.nats_url,
        db_url,
        prefix,
        db_roles=infra.service_roles,
        overrides=overrides,
        executors=0,
    ) as stack:
        client = stack.client
        first = (await client.submit(QUICK)).run.run_id
        low = (await client.submit(QUICK, priority=-5)).run.run_id
        plain = (await client.submit(QUICK)).run.run_id
        high = (await client.submit(QUICK, priority=5)).run.run_id
        higher = (await client.submit(QUICK, priority=7)).run.run_id
        held = await client.get(low)
        assert (held.priority, held.queued_for) == (-5, "share")
        assert (await client.get(first)).queued_for is None  # it has its job
        await client.cancel(first)
        await eventually(lambda: _has_turns(stack, [higher]), timeout=10)
        # `low` has waited longer than priority_max_wait_ms: it goes before `high`.
        await pace(2.1, "low waits past priority_max_wait_ms")
        await client.cancel(higher)
        await eventually(lambda: _has_turns(stack, [higher, low]), timeout=10)
        # Every one has waited that long now: oldest first.
        await client.cancel(low)
        await eventually(lambda: _has_turns(stack, [higher, low, plain]), timeout=10)
        await client.cancel(plain)
        await eventually(lambda: _has_turns(stack, [higher, low, plain, high]), timeout=10)


async def _has_turns(stack: InProcessStack, expected: list[str]) -> bool:
    got = await _turns(stack, [*expected, "-"])
    assert got == expected[: len(got)], got  # never another order
    return got == expected


async def test_a_concurrency_key_limits_its_runs_across_executors(
    infra: Any, db_url: str, prefix: str
) -> None:
    async with InProcessStack(
        infra.nats_url, db_url, prefix, db_roles=infra.service_roles, executors=2
    ) as stack:
        client = stack.client
        limits = await client.set_budget(max_runs_per_key=1)
        assert limits.max_runs_per_key == 1
        mine = [(await client.submit(SLOW, concurrency_key="user-1")).run.run_id for _ in range(6)]
        theirs = [
            (await client.submit(SLOW, concurrency_key="user-2")).run.run_id for _ in range(2)
        ]
        # The key's last run waits behind four others (of 150 ms each): still waiting now,
        # however long the eight submits took (its second may have started already).
        assert (await client.get(mine[-1])).queued_for == "concurrency_key"
        for run_id in mine + theirs:
            await collect(client, run_id)
        timeline = await stack.store.timeline()
    of_mine = [e for e in timeline if e["run_id"] in mine]
    assert max_running(of_mine) == 1  # one at a time, whichever executor took it
    assert sum(e["event"] == "finished" for e in of_mine) == 6
    # Another key's runs did not wait for them: both started before user-1's last.
    claimed = [e["run_id"] for e in timeline if e["event"] == "claimed"]
    assert max(claimed.index(r) for r in theirs) < claimed.index(mine[-1])
    both = [e for e in timeline if e["run_id"] in mine + theirs]
    assert max_running(both) == 2


async def test_a_workflow_ending_with_its_last_node_gives_its_job_to_the_next_run(
    infra: Any, db_url: str, prefix: str
) -> None:
    # Recovery's sweep, which also gives held runs their job, is made too slow to help:
    # only the workflow's end may start the held run's turn.
    overrides = {"tenant_share_runs": 1, "recovery_interval_ms": 60_000}
    async with InProcessStack(
        infra.nats_url, db_url, prefix, db_roles=infra.service_roles, overrides=overrides
    ) as stack:
        client = stack.client
        nodes = [{"id": "only", "runner": "scripted", "input": {"tokens": ["a"]}}]
        await client.release("one-node", 1, {"nodes": nodes})
        workflow = (await client.submit_workflow("one-node", {})).run.run_id
        # The workflow run holds the tenant's one job: this run waits for it.
        held = (await client.submit(QUICK)).run.run_id
        await collect(client, workflow, timeout=30)
        frames, _ = await collect(client, held, timeout=10)
        events = [e["event"] for e in await stack.store.run_events(held)]
    assert frames[-1].data["status"] == "finished"
    assert "share_turn" in events
