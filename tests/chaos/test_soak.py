"""Soak: 500 runs while an executor is killed at random every few seconds (`make test-soak`)."""

import asyncio
import random
import statistics
import time

import pytest

from runwire.contracts.status import RunStatus
from runwire.testing.waiting import pace
from tests.services import ProcessStack, collect

pytestmark = [pytest.mark.soak, pytest.mark.timeout(900)]

RUNS = 500
TOKENS = 20


async def test_no_run_is_lost_while_executors_keep_dying(processes: ProcessStack) -> None:
    rng = random.Random(20261130)
    names = ["executor-a", "executor-b"]
    for name in names:
        processes.start(name, max_in_flight=32)
    scripts = [
        {"tokens": [f"{i}.{t} " for t in range(TOKENS)], "token_delay_ms": 50} for i in range(RUNS)
    ]
    ids = [(await processes.client.submit(s)).run.run_id for s in scripts]
    streams = [asyncio.create_task(collect(processes.client, r, timeout=600)) for r in ids]

    kills = 0
    started = time.monotonic()
    while not all(s.done() for s in streams) and time.monotonic() - started < 500:
        await pace(rng.uniform(2, 4), "the soak's rhythm: a kill every 2 to 4 s")
        victim = rng.choice(names)
        processes.procs[victim].kill()
        kills += 1
        processes.start(victim, max_in_flight=32)
    results = await asyncio.gather(*streams)

    for i, (_, transcript) in enumerate(results):
        assert transcript.text == "".join(scripts[i]["tokens"])  # type: ignore[arg-type]
    runs = [await processes.client.get(r) for r in ids]
    assert {r.status for r in runs} == {RunStatus.FINISHED}

    timeline = await processes.store.timeline()
    lost_at: dict[str, float] = {}
    recovery_s: list[float] = []
    for event in timeline:
        if event["event"] == "recovering":
            lost_at[event["run_id"]] = event["at"].timestamp()
        elif event["event"] == "claimed" and event["run_id"] in lost_at:
            recovery_s.append(event["at"].timestamp() - lost_at.pop(event["run_id"]))
    recovered = sum(1 for r in runs if r.attempts > 1)
    print(
        f"\nsoak: {RUNS} runs, {kills} executors killed, {recovered} runs recovered; "
        f"lease expiry to new attempt: p50 {statistics.median(recovery_s or [0]):.2f}s, "
        f"max {max(recovery_s or [0]):.2f}s"
    )
    assert recovered > 0
