"""`runwire top` against running services: what its snapshot and its text show."""

import asyncio
import os
import sys
from pathlib import Path

import pytest

from runwire.client.top import TopCollector, render_text
from runwire.contracts.status import RunStatus
from runwire.testing.waiting import eventually
from tests.services import InProcessStack, collect

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
FATAL = {"tokens": ["a", "b"], "fail": [{"attempt": 1, "after_tokens": 1, "kind": "fatal"}]}


async def test_snapshot_shows_finished_and_failed_runs(stack: InProcessStack) -> None:
    collector = await TopCollector(
        stack.client.nc, tenant=stack.client.tenant, prefix=stack.prefix
    ).start()
    try:
        ok = [(await stack.client.submit({"tokens": ["a"]})).run.run_id for _ in range(3)]
        bad = (await stack.client.submit(FATAL)).run.run_id
        for run_id in [*ok, bad]:
            await collect(stack.client, run_id)

        async def all_ended() -> bool:
            snap = await collector.snapshot()
            ended = {r.run_id for r in snap.recent if r.status.terminal}
            return ended >= {*ok, bad} and snap.queued == 0 and snap.in_flight == 0

        await eventually(all_ended, timeout=10, interval=0.1)
        snap = await collector.snapshot()
    finally:
        await collector.close()

    statuses = {r.run_id: r.status for r in snap.recent}
    assert all(statuses[run_id] == RunStatus.FINISHED for run_id in ok)
    assert [(r.run_id, r.code) for r in snap.failed] == [(bad, "RUNNER_FATAL")]
    assert snap.recovering == []
    assert snap.queued == 0
    assert snap.oldest_job_age_s is None
    assert snap.ended_per_s > 0
    assert [e.ok for e in snap.executors] == [True]

    text = render_text(snap)
    assert "RUNNER_FATAL" in text
    for run_id in [*ok, bad]:
        assert run_id in text
    assert "finished" in text
    assert "failed" in text


async def test_runwire_top_once_prints_a_snapshot(stack: InProcessStack, tmp_path: Path) -> None:
    run_id = (await stack.client.submit({"tokens": ["a"]})).run.run_id
    await collect(stack.client, run_id)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNWIRE_")}
    env["PYTHONPATH"] = str(ROOT)
    env["RUNWIRE_PREFIX"] = stack.prefix

    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "runwire.client.cli",
        "--nats-url",
        stack.nats_url,
        "top",
        "--once",
        cwd=tmp_path,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)

    assert proc.returncode == 0, err.decode()
    text = out.decode()
    assert "runwire top" in text
    # The run ended before `top` started: it comes from the events stream's history.
    assert run_id in text
    assert "finished" in text
