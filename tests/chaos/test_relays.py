"""The archiving relay killed with -9, or frozen, while attempts publish: Postgres ends
up with every frame once, in order, and the run's frames closed."""

import asyncio
import functools
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from runwire.contracts.subjects import Subjects
from runwire.runtime.broker import Broker
from runwire.runtime.faults import RELAY_UNWRITTEN
from runwire.testing.waiting import eventually, pace
from tests.services import AttemptFrames, ProcessStack, all_frames_stored, archived_seqs

pytestmark = pytest.mark.chaos

ARCHIVING = "archiving the frames stream"


@pytest.fixture
async def broker(service_env: dict[str, str]) -> AsyncIterator[Broker]:
    """A connection that publishes frames as an executor does."""
    connected = await Broker.connect(
        service_env["RUNWIRE_NATS_URL"],
        Subjects(service_env["RUNWIRE_PREFIX"]),
        name="test-executor",
    )
    try:
        yield connected
    finally:
        await connected.close()


async def _archived_once(stack: ProcessStack, run_id: str, frames: int) -> bool:
    return await all_frames_stored(stack.store, run_id, frames) and await archived_seqs(
        stack.store, run_id
    ) == list(range(1, frames + 1))


async def _attempts(
    stack: ProcessStack, broker: Broker, runs: int, frames: int, delay_s: float
) -> tuple[list[AttemptFrames], "asyncio.Future[list[None]]"]:
    """`runs` runs whose attempts publish `frames` text frames each, one every `delay_s`."""
    ids = [(await stack.client.submit({"tokens": ["x"]})).run.run_id for _ in range(runs)]
    chains = [AttemptFrames(broker, run_id) for run_id in ids]

    async def attempt(chain: AttemptFrames) -> None:
        for i in range(frames):
            await chain.run([f"{i} "], done=False)
            await pace(delay_s, "an attempt emits its frames one at a time")
        await chain.run([])

    return chains, asyncio.gather(*(attempt(c) for c in chains))


async def test_a_killed_archiver_loses_and_duplicates_nothing(
    processes: ProcessStack, broker: Broker
) -> None:
    processes.start("relay-2", kind="relay")
    await eventually(lambda: ARCHIVING in processes.procs["relay"].logs(), timeout=30)
    chains, publishing = await _attempts(processes, broker, runs=8, frames=60, delay_s=0.03)

    async def halfway() -> bool:
        run = await processes.store.get_run_by_id(chains[0].run_id)
        return run is not None and run.frame_count >= 20

    await eventually(halfway, timeout=30)
    processes.procs["relay"].kill()
    await eventually(lambda: ARCHIVING in processes.procs["relay-2"].logs(), timeout=30)
    await publishing

    for chain in chains:
        archived = functools.partial(_archived_once, processes, chain.run_id, chain.seq)
        await eventually(archived, timeout=30)


async def test_frames_a_killed_relay_never_wrote_reach_postgres_once(
    service_env: dict[str, str], tmp_path: Path, broker: Broker
) -> None:
    stack = ProcessStack(service_env, tmp_path)
    stack.start("submitter")
    stack.start("relay-a", kind="relay", fault_points=f"{RELAY_UNWRITTEN}=kill")
    try:
        await stack.open()
        run_id = (await stack.client.submit({"tokens": ["x"]})).run.run_id
        chain = AttemptFrames(broker, run_id)
        await chain.run([f"t{i} " for i in range(20)])
        # The relay died as it was about to write the run's last segment (`done` in it);
        # it had acknowledged none of those frames.
        proc = stack.procs["relay-a"].proc
        assert proc is not None
        await eventually(lambda: proc.poll() == -signal.SIGKILL, timeout=30)
        run = await stack.store.get_run_by_id(run_id)
        assert run is not None
        assert not run.frames_closed

        stack.start("relay-b", kind="relay")
        await eventually(lambda: _archived_once(stack, run_id, chain.seq), timeout=30)
        replay = await stack.client.join(run_id, 0)
        assert [f.seq for f in replay.replay] == list(range(1, chain.seq + 1))
    finally:
        await stack.close()


async def test_a_frozen_archiver_loses_the_lock_and_writes_nothing_twice_when_it_wakes(
    service_env: dict[str, str], tmp_path: Path, broker: Broker
) -> None:
    stack = ProcessStack(service_env, tmp_path)
    stack.start("submitter")
    stack.start("relay-a", kind="relay", partition_timeout_ms=3000)
    try:
        await stack.open()
        frozen = stack.procs["relay-a"]
        await eventually(lambda: ARCHIVING in frozen.logs(), timeout=30)
        stack.start("relay-b", kind="relay")
        chains, publishing = await _attempts(stack, broker, runs=6, frames=80, delay_s=0.03)

        async def started() -> bool:
            run = await stack.store.get_run_by_id(chains[0].run_id)
            return run is not None and run.frame_count >= 10

        await eventually(started, timeout=30)
        # SIGSTOP: its process and connections stay up; Postgres ends its lock session
        # once it has been idle past the timeout, and relay-b takes the archive over.
        frozen.signal(signal.SIGSTOP)
        try:
            await eventually(lambda: ARCHIVING in stack.procs["relay-b"].logs(), timeout=30)
            await publishing
            for chain in chains:
                archived = functools.partial(_archived_once, stack, chain.run_id, chain.seq)
                await eventually(archived, timeout=30)
        finally:
            frozen.signal(signal.SIGCONT)

        # Awake, it finds its lock gone and writes what it held (some of the same frames).
        await eventually(lambda: "partition locks lost" in frozen.logs(), timeout=30)
        await eventually(lambda: "stopped archiving" in frozen.logs(), timeout=30)
        for chain in chains:
            assert await _archived_once(stack, chain.run_id, chain.seq)
    finally:
        await stack.close()
