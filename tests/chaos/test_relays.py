"""One of two relays killed with -9, or frozen, mid-stream: the other takes its
partitions over."""

import asyncio
import functools
import signal
from pathlib import Path

import pytest

from runwire.contracts.frames import FrameType
from runwire.runtime.faults import RELAY_UNWRITTEN
from runwire.testing.waiting import eventually, fault_window
from tests.services import ProcessStack, all_frames_stored, assert_well_formed, collect

pytestmark = pytest.mark.chaos


async def _started(stack: ProcessStack, ids: list[str]) -> bool:
    for run_id in ids:
        if len((await stack.client.join(run_id, 0)).replay) < 3:
            return False
    return True


async def _sharing(stack: ProcessStack, name: str) -> None:
    """Wait until relay `name` owns partitions and the first relay gave some up: runs
    submitted from now on are spread over both."""
    await eventually(lambda: "took raw-frames partition" in stack.procs[name].logs(), timeout=30)
    await eventually(lambda: "released raw-frames partition" in stack.procs["relay"].logs())


async def test_killed_relay_partitions_move_to_the_survivor(processes: ProcessStack) -> None:
    processes.start("relay-2", kind="relay")
    processes.start("executor")
    await _sharing(processes, "relay-2")
    scripts = [{"tokens": [f"{i}~{t} " for t in range(50)], "token_delay_ms": 30} for i in range(8)]
    ids = [(await processes.client.submit(s)).run.run_id for s in scripts]
    streams = [asyncio.create_task(collect(processes.client, r, timeout=90)) for r in ids]
    await eventually(lambda: _started(processes, ids), timeout=20)

    processes.procs["relay-2"].kill()
    results = await asyncio.gather(*streams)

    for i, (frames, transcript) in enumerate(results):
        assert_well_formed(frames)
        assert transcript.text == "".join(scripts[i]["tokens"])  # type: ignore[arg-type]
        # Postgres catches up with the stream: every frame is in a segment.
        stored = functools.partial(all_frames_stored, processes.store, ids[i], len(frames))
        await eventually(stored, timeout=20)


async def test_a_frozen_relay_loses_its_partitions_and_does_nothing_when_it_wakes(
    processes: ProcessStack,
) -> None:
    # The first relay already runs with the default timeout; this one may be frozen.
    processes.start("relay-2", kind="relay", partition_timeout_ms=3000)
    processes.start("executor")
    await _sharing(processes, "relay-2")
    scripts = [
        {"tokens": [f"{i}~{t} " for t in range(80)], "token_delay_ms": 40} for i in range(12)
    ]
    ids = [(await processes.client.submit(s)).run.run_id for s in scripts]
    streams = [asyncio.create_task(collect(processes.client, r, timeout=90)) for r in ids]
    await eventually(lambda: _started(processes, ids), timeout=20)

    # SIGSTOP: its process and its connections stay up, so Postgres would keep its locks.
    frozen = processes.procs["relay-2"]
    taken = processes.procs["relay"].logs().count("took raw-frames partition")
    frozen.signal(signal.SIGSTOP)
    try:
        # Every run streams to its end while relay-2 is still frozen: its partitions moved.
        results = await asyncio.wait_for(asyncio.gather(*streams), 60)
        # And the first relay took partitions over: Postgres ended relay-2's lock session.
        relay = processes.procs["relay"]
        await eventually(lambda: relay.logs().count("took raw-frames partition") > taken, 30)
    finally:
        frozen.signal(signal.SIGCONT)

    await eventually(lambda: "partition locks lost" in frozen.logs(), timeout=20)
    for i, run_id in enumerate(ids):
        frames, transcript = results[i]
        assert_well_formed(frames)
        assert transcript.text == "".join(scripts[i]["tokens"])  # type: ignore[arg-type]
        # Nothing the woken relay did shows up: a fresh read of the run is the same.
        again, _ = await collect(processes.client, run_id, timeout=30)
        assert [f.seq for f in again] == [f.seq for f in frames]
        stored = functools.partial(all_frames_stored, processes.store, run_id, len(frames))
        await eventually(stored, timeout=20)
    # The woken relay takes a share of the partitions again, and runs still stream.
    await eventually(lambda: "took raw-frames partition" in frozen.logs().split("locks lost")[-1])
    reply = await processes.client.submit({"tokens": ["still ", "here"]})
    _, transcript = await collect(processes.client, reply.run.run_id)
    assert transcript.text == "still here"


async def test_frames_a_killed_relay_published_but_never_wrote_reach_postgres(
    service_env: dict[str, str], tmp_path: Path
) -> None:
    # No recovery here: nothing but the relays can get the run's frames into Postgres.
    stack = ProcessStack(service_env, tmp_path)
    stack.start("submitter")
    stack.start("relay-a", kind="relay", fault_points=f"{RELAY_UNWRITTEN}=kill")
    stack.start("executor")
    try:
        await stack.open()
        tokens = [f"t{i} " for i in range(20)]
        run_id = (await stack.client.submit({"tokens": tokens})).run.run_id
        # Every frame, `done` included, reached clients; the relay died before writing the
        # run's last segment (it had acknowledged none of those raw frames).
        frames, transcript = await collect(stack.client, run_id)
        assert_well_formed(frames)
        assert transcript.text == "".join(tokens)
        await eventually(lambda: stack.procs["relay-a"].proc.poll() == -signal.SIGKILL)  # type: ignore[union-attr]
        run = await stack.store.get_run_by_id(run_id)
        assert run is not None
        assert not run.frames_closed

        stack.start("relay-b", kind="relay")
        stored = functools.partial(all_frames_stored, stack.store, run_id, len(frames))
        await eventually(stored, timeout=30)
        replay = await stack.client.join(run_id, 0)
        assert [f.seq for f in replay.replay] == [f.seq for f in frames]
    finally:
        await stack.close()


async def test_a_retry_resumes_after_the_closing_error_of_the_attempt_before(
    processes: ProcessStack,
) -> None:
    # The relay is frozen between the first attempt's text and its failure: the failure's
    # `error` frame is published but not stored when the second attempt starts. That
    # attempt's `run` frame must still mark its cut after the error frame, not before.
    processes.start("executor", resume_wait_ms=20_000)
    script = {
        "tokens": ["a ", "b ", "c "],
        "token_delay_ms": 1500,
        "fail": [{"attempt": 1, "after_tokens": 1, "kind": "retryable"}],
    }
    run_id = (await processes.client.submit(script)).run.run_id

    async def first_token_stored() -> bool:
        run = await processes.store.get_run_by_id(run_id)
        return run is not None and run.frame_count >= 2  # its `run` frame and "a "

    await eventually(first_token_stored, timeout=20)
    relay = processes.procs["relay"]
    relay.signal(signal.SIGSTOP)
    try:

        async def second_attempt() -> bool:
            run = await processes.store.get_run_by_id(run_id)
            return run is not None and run.attempts == 2

        await eventually(second_attempt, timeout=20)
        await fault_window(1, "an attempt that does not wait for the relay publishes meanwhile")
    finally:
        relay.signal(signal.SIGCONT)

    frames, transcript = await collect(processes.client, run_id, timeout=60)
    assert_well_formed(frames)
    assert transcript.text == "a b c "
    error = next(f for f in frames if f.type == FrameType.ERROR)
    second = next(f for f in frames if f.type == FrameType.RUN and f.data["attempt"] == 2)
    assert error.seq < second.seq
    assert second.data["resume_after"] >= error.seq, (error, second)
