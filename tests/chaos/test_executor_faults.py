"""An executor frozen, killed or stopped mid-run: every run finishes, each token once."""

import asyncio
import signal

import pytest

from runwire.contracts.frames import FrameType
from runwire.contracts.status import RunStatus
from runwire.testing.waiting import eventually
from tests.services import ProcessStack, assert_well_formed, collect, max_running

pytestmark = pytest.mark.chaos

TOKENS = [f"tok{i} " for i in range(40)]


async def _running_on(stack: ProcessStack, run_id: str, owner: str) -> bool:
    run = await stack.store.get_run_by_id(run_id)
    return bool(run and run.status == RunStatus.RUNNING and run.last_seq >= 5)


async def test_paused_executor_is_taken_over_and_its_late_frames_are_dropped(
    processes: ProcessStack,
) -> None:
    first = processes.start("executor-a")
    reply = await processes.client.submit({"tokens": TOKENS, "token_delay_ms": 50})
    run_id = reply.run.run_id
    await eventually(lambda: _running_on(processes, run_id, "executor-a"), timeout=20)

    first.signal(signal.SIGSTOP)  # frozen past its lease (1 s)
    processes.start("executor-b")
    run = await eventually(lambda: _attempt(processes, run_id, 2), timeout=20)
    first.signal(signal.SIGCONT)  # comes back and tries to go on

    frames, transcript = await collect(processes.client, run_id, timeout=60)

    assert_well_formed(frames)
    assert transcript.text == "".join(TOKENS)
    final = await processes.client.get(run_id)
    assert final.status == RunStatus.FINISHED
    assert final.attempts == run.attempts == 2
    assert final.result == {"text": "".join(TOKENS)}
    starts = [f.data for f in frames if f.type == FrameType.RUN]
    assert [s["attempt"] for s in starts] == [1, 2]
    assert starts[1]["resumed"] is True
    # The first executor is still alive and healthy after being fenced out.
    assert first.proc is not None
    assert first.proc.poll() is None


async def _attempt(stack: ProcessStack, run_id: str, attempts: int):  # type: ignore[no-untyped-def]
    run = await stack.store.get_run_by_id(run_id)
    assert run is not None
    assert run.attempts == attempts
    assert run.status == RunStatus.RUNNING
    return run


async def test_killed_executor_runs_are_recovered_elsewhere(processes: ProcessStack) -> None:
    victim = processes.start("executor-a")
    replies = [
        await processes.client.submit(
            {"tokens": [f"r{i}-{t}" for t in TOKENS], "token_delay_ms": 40}
        )
        for i in range(4)
    ]
    ids = [r.run.run_id for r in replies]
    for run_id in ids:
        await eventually(lambda run_id=run_id: _running_on(processes, run_id, "a"), timeout=20)

    victim.kill()
    # What Postgres held when the executor died: a resumed attempt keeps all of it.
    stored = {}
    for run_id in ids:
        row = await processes.store.get_run_by_id(run_id)
        assert row is not None
        stored[run_id] = row.last_seq
    processes.start("executor-b")
    results = await asyncio.gather(*(collect(processes.client, i, timeout=60) for i in ids))

    for i, (frames, transcript) in enumerate(results):
        assert_well_formed(frames)
        assert transcript.text == "".join(f"r{i}-{t}" for t in TOKENS)
        run = await processes.client.get(ids[i])
        assert run.status == RunStatus.FINISHED
        assert run.attempts == 2
        resumed = next(f for f in frames if f.type == FrameType.RUN and f.data["resumed"])
        # Taken back (frames after `resume_after`): only what the relay had published
        # but not stored yet when the executor died.
        assert resumed.data["resume_after"] >= stored[ids[i]]


async def _recovered_because(stack: ProcessStack, run_id: str) -> str:
    """Why recovery took the run from its first attempt's executor."""
    events = await stack.store.run_events(run_id)
    (reason,) = [e["reason"] for e in events if e["event"] == "recovering"]
    return str(reason)


@pytest.mark.parametrize("tick_ms", [None, 120_000], ids=["at its tick", "between its ticks"])
async def test_a_killed_executors_runs_resume_at_once_not_when_their_leases_run_out(
    processes: ProcessStack, tick_ms: int | None
) -> None:
    if tick_ms is not None:
        # Recovery ticks every two minutes: only its lease watch (every 100 ms) can see
        # within the test's patience that the executor is gone.
        processes.procs["recovery"].stop()
        processes.start("recovery", recovery_interval_ms=tick_ms, lease_watch_ms=100)
    # Leases of a minute: the runs can resume within seconds only because Postgres saw
    # the dead executor's connection end and freed its presence lock.
    victim = processes.start("executor-a", lease_ttl_ms=60_000)
    # Long enough (about 6 s each) to be still running once the second executor is ready
    # on a busy machine.
    tokens = TOKENS * 4
    ids = [
        (await processes.client.submit({"tokens": tokens, "token_delay_ms": 40})).run.run_id
        for _ in range(3)
    ]
    for run_id in ids:
        await eventually(lambda run_id=run_id: _running_on(processes, run_id, "a"), timeout=20)
    processes.start("executor-b", lease_ttl_ms=60_000)
    await eventually(lambda: "executor ready" in processes.procs["executor-b"].logs(), timeout=20)

    for run_id in ids:
        assert await _running_on(processes, run_id, "a"), "a run ended before the kill"
    victim.kill()
    results = await asyncio.gather(*(collect(processes.client, r, timeout=60) for r in ids))

    for run_id, (frames, transcript) in zip(ids, results, strict=True):
        assert_well_formed(frames)
        assert transcript.text == "".join(tokens)
        run = await processes.client.get(run_id)
        assert (run.status, run.attempts) == (RunStatus.FINISHED, 2)
        assert await _recovered_because(processes, run_id) == "executor gone"


async def test_a_frozen_executor_keeps_its_presence_and_loses_its_runs_at_the_lease(
    processes: ProcessStack,
) -> None:
    frozen = processes.start("executor-a", lease_ttl_ms=2000, heartbeat_ms=200)
    reply = await processes.client.submit({"tokens": TOKENS, "token_delay_ms": 50})
    run_id = reply.run.run_id
    await eventually(lambda: _running_on(processes, run_id, "a"), timeout=20)

    frozen.signal(signal.SIGSTOP)  # alive, its connections open: only the lease tells
    try:
        processes.start("executor-b")
        await eventually(lambda: _attempt(processes, run_id, 2), timeout=20)
    finally:
        frozen.signal(signal.SIGCONT)
    frames, transcript = await collect(processes.client, run_id, timeout=60)

    assert_well_formed(frames)
    assert transcript.text == "".join(TOKENS)
    assert await _recovered_because(processes, run_id) == "lease expired"


async def test_sigterm_returns_runs_to_the_queue_and_they_finish_elsewhere(
    processes: ProcessStack,
) -> None:
    draining = processes.start("executor-a", max_in_flight=20)
    replies = [
        await processes.client.submit(
            {"tokens": [f"s{i}:{t}" for t in TOKENS], "token_delay_ms": 100}
        )
        for i in range(20)
    ]
    ids = [r.run.run_id for r in replies]
    await eventually(lambda: _all_running(processes, ids), timeout=30)

    draining.signal(signal.SIGTERM)
    assert draining.proc is not None
    exit_code = await asyncio.to_thread(draining.proc.wait, 15)
    assert exit_code == 0
    processes.start("executor-b", max_in_flight=20)
    results = await asyncio.gather(*(collect(processes.client, i, timeout=90) for i in ids))

    for i, (frames, transcript) in enumerate(results):
        assert_well_formed(frames)
        assert transcript.text == "".join(f"s{i}:{t}" for t in TOKENS)
        run = await processes.client.get(ids[i])
        assert run.status == RunStatus.FINISHED
        # The attempt cut short by the shutdown is not counted as a failure.
        assert run.attempts == 1
    # Each attempt cut short went back to the queue and was finished by the other one.
    timeline = await processes.store.timeline()
    released = {e["run_id"] for e in timeline if e["event"] == "released"}
    assert len(released) >= 15
    for run_id in released:
        claims = [e["actor"] for e in timeline if e["run_id"] == run_id and e["event"] == "claimed"]
        assert claims == ["executor-a", "executor-b"]


async def _all_running(stack: ProcessStack, ids: list[str]) -> bool:
    for run_id in ids:
        run = await stack.store.get_run_by_id(run_id)
        if run is None or run.status != RunStatus.RUNNING:
            return False
    return True


async def test_in_flight_limit_holds_across_two_executor_processes(
    processes: ProcessStack,
) -> None:
    for name in ("executor-a", "executor-b"):
        processes.start(name, max_in_flight=3)
    replies = [
        await processes.client.submit({"tokens": [f"f{i}", "."], "token_delay_ms": 150})
        for i in range(15)
    ]
    results = await asyncio.gather(
        *(collect(processes.client, r.run.run_id, timeout=90) for r in replies)
    )

    for i, (_, transcript) in enumerate(results):
        assert transcript.text == f"f{i}."
    peak = max_running(await processes.store.timeline())
    assert peak <= 3
    assert peak >= 2  # both processes did take work at once
    owners = {e["actor"] for e in await processes.store.timeline() if e["event"] == "claimed"}
    assert owners == {"executor-a", "executor-b"}


async def test_a_dead_executors_jobs_do_not_hold_the_in_flight_limit(
    processes: ProcessStack,
) -> None:
    # A long ack wait: without recovery releasing the dead executor's jobs, they would
    # hold both in-flight slots for 30 s and nothing could start.
    limits = {"max_in_flight": 2, "ack_wait_ms": 30_000}
    victim = processes.start("executor-a", **limits)
    first = [
        (await processes.client.submit({"tokens": TOKENS, "token_delay_ms": 50})).run.run_id
        for _ in range(2)
    ]
    for run_id in first:
        await eventually(lambda run_id=run_id: _running_on(processes, run_id, "a"), timeout=20)

    victim.kill()
    processes.start("executor-b", **limits)
    later = [(await processes.client.submit({"tokens": ["quick"]})).run.run_id for _ in range(2)]
    results = await asyncio.gather(
        *(collect(processes.client, r, timeout=20) for r in [*first, *later])
    )

    for frames, _ in results:
        assert frames[-1].data == {"status": "finished"}
