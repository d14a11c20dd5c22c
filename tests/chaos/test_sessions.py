"""A session's queue lives in Postgres: it outlives killed executors and restarted services."""

import itertools
from typing import Any

import pytest

from runwire.contracts.status import RunStatus
from runwire.runtime.store import Run
from runwire.testing.waiting import eventually
from tests.services import ProcessStack, assert_well_formed, collect

pytestmark = pytest.mark.chaos

SESSION = "chat-1"


def _script(tag: str, n: int, delay_ms: int) -> dict[str, Any]:
    return {"tokens": [f"{tag}{i} " for i in range(n)], "token_delay_ms": delay_ms}


def _text(script: dict[str, Any]) -> str:
    return "".join(script["tokens"])


async def _row(stack: ProcessStack, run_id: str) -> Run:
    run = await stack.store.get_run_by_id(run_id)
    assert run is not None
    return run


async def _streaming(stack: ProcessStack, run_id: str) -> Run:
    run = await _row(stack, run_id)
    assert run.status == RunStatus.RUNNING
    assert run.last_seq >= 5
    return run


def _one_after_another(runs: list[Run]) -> None:
    for before, after in itertools.pairwise(runs):
        assert before.ended_at is not None
        assert after.started_at is not None
        assert before.ended_at <= after.started_at, (before.run_id, after.run_id)


async def _enqueue(stack: ProcessStack, scripts: list[dict[str, Any]]) -> list[str]:
    return [
        (await stack.client.submit(s, session_id=SESSION, multitask="enqueue")).run.run_id
        for s in scripts
    ]


async def test_queued_run_starts_after_the_executor_of_the_active_one_is_killed(
    processes: ProcessStack,
) -> None:
    victim = processes.start("executor-a")
    scripts = [_script("a", 40, 40), _script("b", 5, 10)]
    ids = await _enqueue(processes, scripts)
    await eventually(lambda: _streaming(processes, ids[0]), timeout=20)

    victim.kill()
    processes.start("executor-b")

    for run_id, script in zip(ids, scripts, strict=True):
        frames, transcript = await collect(processes.client, run_id, timeout=60)
        assert_well_formed(frames)
        assert transcript.text == _text(script)
    rows = [await _row(processes, run_id) for run_id in ids]
    assert [r.status for r in rows] == [RunStatus.FINISHED, RunStatus.FINISHED]
    # The active run was recovered and finished first; only then did the next one start.
    assert [r.attempts for r in rows] == [2, 1]
    _one_after_another(rows)


async def test_a_session_queue_survives_a_restart_of_every_service(
    processes: ProcessStack,
) -> None:
    processes.start("executor")
    scripts = [_script("a", 30, 40), *(_script(t, 4, 10) for t in ("b", "c", "d"))]
    ids = await _enqueue(processes, scripts)
    await eventually(lambda: _streaming(processes, ids[0]), timeout=20)

    for name in ("executor", "submitter", "relay", "recovery"):
        processes.procs[name].kill()
    for name in ("submitter", "relay", "recovery", "executor"):
        processes.start(name)

    for run_id, script in zip(ids, scripts, strict=True):
        frames, transcript = await collect(processes.client, run_id, timeout=60)
        assert_well_formed(frames)
        assert transcript.text == _text(script)
    rows = [await _row(processes, run_id) for run_id in ids]
    assert {r.status for r in rows} == {RunStatus.FINISHED}
    assert [r.attempts for r in rows] == [2, 1, 1, 1]
    _one_after_another(rows)
