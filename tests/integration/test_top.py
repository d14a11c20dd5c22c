"""`runwire top` against running services: what its snapshot and its text show."""

import asyncio
import logging
import os
import sys
import time
from pathlib import Path

import pytest

from runwire.client import Client
from runwire.client.top import TopCollector, render_text
from runwire.contracts.identities import OPERATOR, tenant_user
from runwire.contracts.status import RunStatus
from runwire.testing.waiting import eventually
from tests.secured import Broker
from tests.services import InProcessStack, collect

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
# The first screen, history included, is this quick (JetStream requests on loopback).
FIRST_SCREEN_S = 2.0
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
    # The tenant's fair share of executor slots and its queue, at the stack's defaults.
    assert "the tenant's share" in text
    share = next(line for line in text.splitlines() if " 64 " in line and "10000" in line)
    assert [c.strip() for c in share.split("│") if c.strip()] == ["0", "64", "1", "0", "0", "10000"]


async def test_top_shows_a_tenant_its_own_runs_and_the_operator_the_whole_queue(
    broker: Broker, secured: InProcessStack, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """On a broker that enforces identities: a tenant's `top` is refused nothing (its
    consumer keeps the rules recovery holds tenants' consumers to) and shows its own runs
    only; the operator's reads the jobs stream too. Both show the history at once."""
    caplog.set_level(logging.WARNING, logger="runwire.recovery")
    prefix = broker.subjects.prefix
    acme = await broker.tenant("acme")
    globex = await broker.tenant("globex")
    operator = await Client.connect(
        broker.server.url,
        tenant="acme",
        prefix=prefix,
        user=OPERATOR,
        password=broker.identities.passwords[OPERATOR],
    )
    collectors: list[TopCollector] = []
    try:
        ended = (await acme.submit({"tokens": ["a"]})).run.run_id
        theirs = (await globex.submit({"tokens": ["b"]})).run.run_id
        await collect(acme, ended)
        await collect(globex, theirs)
        await secured.stop_service("executor-0")  # from now on, jobs wait in the queue
        waiting = (await acme.submit({"tokens": ["c"]})).run.run_id

        views = {}
        for name, client, tenant_only in (("tenant", acme, True), ("operator", operator, False)):
            began = time.monotonic()
            collector = TopCollector(
                client.nc, tenant="acme", prefix=prefix, tenant_only=tenant_only
            )
            collectors.append(await collector.start())
            await collector.history()
            views[name] = await collector.snapshot()
            assert time.monotonic() - began < FIRST_SCREEN_S, name

        for name, snap in views.items():
            assert snap.problems == [], name
            statuses = {r.run_id: r.status for r in snap.recent}
            assert statuses == {ended: RunStatus.FINISHED, waiting: RunStatus.QUEUED}, name
            assert (snap.queued, snap.in_flight) == (1, 0), name
            assert snap.oldest_job_age_s is not None, name
        assert views["operator"].jobs_stored == 1

        # Both consumers outlive recovery's look at them: a later run shows up live.
        late = (await acme.submit({"tokens": ["d"]})).run.run_id
        for collector in collectors:

            async def seen(collector: TopCollector = collector) -> bool:
                return late in {r.run_id for r in (await collector.snapshot()).recent}

            await eventually(seen, timeout=10, interval=0.2)
    finally:
        for collector in collectors:
            await collector.close()
        for client in (acme, globex, operator):
            await client.close()
    assert "a tenant's consumer removed" not in caplog.text

    # As a user types it, with each identity's settings file.
    for user, tenant in ((tenant_user("acme"), "acme"), (OPERATOR, "acme")):
        settings = tmp_path / f"{user}.env"
        settings.write_text(
            f"RUNWIRE_NATS_URL={broker.server.url}\nRUNWIRE_PREFIX={prefix}\n"
            f"RUNWIRE_TENANT={tenant}\nRUNWIRE_NATS_USER={user}\n"
            f"RUNWIRE_NATS_PASSWORD={broker.identities.passwords[user]}\n"
        )
        code, text, err = await _top_once(tmp_path, "--env", str(settings))
        assert code == 0, err
        assert {ended, waiting, late} <= set(text.split()), text
        assert theirs not in text
        assert not [line for line in text.splitlines() if line.startswith("!")], text


async def _top_once(folder: Path, *args: str) -> tuple[int, str, str]:
    """`runwire ARGS top --once` in `folder`, with no runwire setting of this process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNWIRE_")}
    env["PYTHONPATH"] = str(ROOT)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "runwire.client.cli",
        *args,
        "top",
        "--once",
        cwd=folder,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()
