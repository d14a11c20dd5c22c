"""Schedules across a recovery killed with kill -9: the replica that fires a schedule
dies right after its fire committed, before the fire's run got its job; the replicas
started after it make each missed fire once, and the dead one's run still runs."""

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from runwire.runtime import faults
from runwire.testing.waiting import eventually, fault_window
from tests.services import ProcessStack, ServiceProcess

pytestmark = pytest.mark.chaos

EVERY_SECOND = "* * * * * *"


async def _runs(stack: ProcessStack) -> list[dict[str, Any]]:
    rows = await stack.store._pool.fetch(
        "SELECT metadata->>'fire_at' AS fire_at, status::text AS status FROM runs"
        " WHERE metadata->>'schedule' = 'tick' ORDER BY 1"
    )
    return [dict(r) for r in rows]


def _dead(proc: ServiceProcess) -> bool:
    return proc.proc is not None and proc.proc.poll() is not None


async def test_each_fire_runs_once_when_the_replica_that_fired_it_is_killed(
    processes: ProcessStack,
) -> None:
    processes.start("executor")
    # The recovery that fires first dies right after its fire committed.
    processes.procs["recovery"].kill()
    armed = processes.start("recovery", fault_points=f"{faults.SCHEDULE_FIRED}=kill")
    await processes.client.set_schedule(
        "tick", EVERY_SECOND, input={"tokens": ["tick"]}, overlap="allow", catch_up_s=60
    )
    await eventually(lambda: _dead(armed), timeout=60)
    killed_at = datetime.now(UTC)
    assert f"fault point {faults.SCHEDULE_FIRED}" in armed.logs()
    made = await _runs(processes)
    # Its tick made the fires due by then (one, or a few when a busy machine was slow to
    # start ticking: they are caught up in one tick); none got its job.
    assert made
    assert all(datetime.fromisoformat(r["fire_at"]) <= killed_at for r in made)
    assert {r["status"] for r in made} == {"queued"}
    await fault_window(2.5, "no recovery: fires are missed")
    # Two replicas race for every fire from now on.
    processes.start("recovery")
    processes.start("recovery-2", "recovery")

    async def caught_up() -> bool:
        runs = await _runs(processes)
        last = datetime.fromisoformat(runs[-1]["fire_at"])
        return last >= killed_at + timedelta(seconds=4)

    await eventually(caught_up, timeout=60)
    await processes.client.set_schedule(
        "tick", EVERY_SECOND, input={"tokens": ["tick"]}, overlap="allow", paused=True
    )

    async def all_ran() -> list[dict[str, Any]]:
        runs = await _runs(processes)
        return runs if all(r["status"] == "finished" for r in runs) else []

    runs = await eventually(all_ran, timeout=60)
    fires = [datetime.fromisoformat(r["fire_at"]) for r in runs]
    assert len(fires) == len(set(fires))  # each fire once
    seconds = {int(f.timestamp()) for f in fires}
    # No second missing from the first fire to the last: the outage's were made up.
    assert seconds == set(range(min(seconds), max(seconds) + 1))
