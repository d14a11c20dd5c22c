"""kill -9 of the executor at every step of a side effect, and a frozen one that wakes
up after its run moved on: the endpoint sees exactly one charge per key."""

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from runwire.contracts.status import RunStatus
from runwire.runtime import faults
from runwire.testing.waiting import eventually
from tests.effect_server import EffectServer
from tests.services import ProcessStack, collect

pytestmark = pytest.mark.chaos

RUNNERS = "charge=tests.runners:charge"


def _charge(server: EffectServer) -> dict[str, Any]:
    return {
        "url": f"{server.url}/charge",
        "status_url": f"{server.url}/charges/{{idempotency_key}}",
        "amount": 40,
        "cost": 40,  # reserved from the tenant's cost budget with the effect
    }


async def _stack(service_env: dict[str, str], tmp_path: Path) -> ProcessStack:
    stack = ProcessStack({**service_env, "RUNWIRE_RUNNERS": RUNNERS}, tmp_path)
    for name in ("submitter", "relay", "recovery"):
        stack.start(name)
    await stack.open()
    await stack.allow_effects("http")
    return stack


async def _effect_rows(db_url: str, run_id: str) -> list[dict[str, Any]]:
    conn = await asyncpg.connect(db_url)
    try:
        rows = await conn.fetch(
            "SELECT state::text, fence, receipt FROM effects WHERE run_id = $1", run_id
        )
    finally:
        await conn.close()
    return [{"state": r[0], "fence": r[1], "receipt": json.loads(r[2] or "null")} for r in rows]


def _dead(proc: Any) -> bool:
    return proc.proc is not None and proc.proc.poll() is not None


@pytest.mark.parametrize(
    "crash",
    [
        faults.EFFECT_PREPARED,
        faults.EFFECT_CLAIMED,
        "during dispatch",
        faults.EFFECT_DISPATCHED,
        faults.EFFECT_COMMITTED,
    ],
)
async def test_a_crash_at_any_step_of_an_effect_charges_exactly_once(
    crash: str, service_env: dict[str, str], tmp_path: Path
) -> None:
    async with EffectServer() as server:
        stack = await _stack(service_env, tmp_path)
        try:
            if crash == "during dispatch":
                server.hold = True  # performs the charge, never answers
                victim = stack.start("executor-a")
            else:
                victim = stack.start("executor-a", fault_points=f"{crash}=kill")
            await stack.client.set_budget(cost=100)
            reply = await stack.client.submit(_charge(server), runner="charge")
            if crash == "during dispatch":
                await asyncio.wait_for(server.received.wait(), 30)
                victim.kill()
            else:
                await eventually(lambda: _dead(victim), timeout=30)
            server.hold = False
            stack.start("executor-b")
            _, transcript = await collect(stack.client, reply.run.run_id, timeout=60)
            run = await stack.client.get(reply.run.run_id)
            rows = await _effect_rows(service_env["RUNWIRE_DATABASE_URL"], reply.run.run_id)
            budget = await stack.client.budget()
        finally:
            await stack.close()

    assert run.status == RunStatus.FINISHED, stack.logs()
    assert list(server.charges.values()) == [1]
    assert transcript.text == "charged 40 as ch_1"
    assert [(r["state"], r["receipt"]["id"]) for r in rows] == [("committed", "ch_1")]
    # Charged once to the budget too, whichever attempt committed it.
    assert (budget.cost_used, budget.cost_reserved) == (40, 0)


async def test_a_frozen_executor_that_wakes_up_cannot_charge_over_the_new_attempt(
    service_env: dict[str, str], tmp_path: Path
) -> None:
    async with EffectServer() as server:
        stack = await _stack(service_env, tmp_path)
        try:
            # Frozen right after it claimed the effect (fence 1), before dispatching it.
            zombie = stack.start("executor-a", fault_points=f"{faults.EFFECT_CLAIMED}=stop")
            reply = await stack.client.submit(_charge(server), runner="charge")
            assert zombie.proc is not None
            pid = zombie.proc.pid

            def stopped() -> bool:
                return Path(f"/proc/{pid}/stat").read_text().split()[2] == "T"

            await eventually(stopped, timeout=30)
            stack.start("executor-b")  # its lease expires; the run resumes here
            _, transcript = await collect(stack.client, reply.run.run_id, timeout=60)
            before = await _effect_rows(service_env["RUNWIRE_DATABASE_URL"], reply.run.run_id)
            zombie.signal(signal.SIGCONT)
            await eventually(lambda: bool(server.refused), timeout=30)
            after = await _effect_rows(service_env["RUNWIRE_DATABASE_URL"], reply.run.run_id)
            run = await stack.client.get(reply.run.run_id)
        finally:
            await stack.close()

    assert run.status == RunStatus.FINISHED
    assert transcript.text == "charged 40 as ch_1"
    assert list(server.charges.values()) == [1]
    # The zombie's dispatch carried the stale fence and was refused ...
    assert [fence for _, fence in server.refused] == [1]
    # ... and its attempt changed nothing.
    assert before == after
    assert [(r["state"], r["fence"]) for r in after] == [("committed", 2)]
