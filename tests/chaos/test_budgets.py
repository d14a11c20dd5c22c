"""kill -9 between a costly call and its settlement: the next attempt's usage is settled
once, and what the dead attempt reserved is charged (its call may have happened)."""

from pathlib import Path

import pytest

from runwire.contracts.status import RunStatus
from runwire.runtime import faults
from runwire.testing.waiting import eventually
from tests.services import ProcessStack, collect

pytestmark = pytest.mark.chaos


async def test_a_crash_before_settlement_charges_what_the_dead_attempt_reserved(
    service_env: dict[str, str], tmp_path: Path
) -> None:
    stack = ProcessStack({**service_env, "RUNWIRE_RUNNERS": "spend=tests.runners:spend"}, tmp_path)
    for name in ("submitter", "relay", "recovery"):
        stack.start(name)
    try:
        await stack.open()
        await stack.client.set_budget(tokens=500)
        victim = stack.start("executor-a", fault_points=f"{faults.BUDGET_UNSETTLED}=kill")
        reply = await stack.client.submit({"reserve": 60, "use": 40}, runner="spend")
        await eventually(lambda: victim.proc is not None and victim.proc.poll() is not None, 30)
        stack.start("executor-b")
        _, transcript = await collect(stack.client, reply.run.run_id, timeout=60)
        run = await stack.client.get(reply.run.run_id)

        async def closed() -> bool:
            return (await stack.client.budget()).reserved == 0

        await eventually(closed, timeout=20)
        budget = await stack.client.budget()
    finally:
        await stack.close()

    assert (run.status, run.attempts) == (RunStatus.FINISHED, 2)
    assert transcript.text == "spent 40"
    # 60 reserved by the dead attempt, charged; 40 used by the second.
    assert (budget.used, budget.reserved, budget.left) == (100, 0, 400)
