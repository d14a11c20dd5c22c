"""One of two relays killed with -9 mid-stream: the other takes its partitions over."""

import asyncio

import pytest

from tests.services import ProcessStack, assert_well_formed, collect
from tests.support import eventually

pytestmark = pytest.mark.chaos


async def _started(stack: ProcessStack, ids: list[str]) -> bool:
    for run_id in ids:
        if len((await stack.client.join(run_id, 0)).replay) < 3:
            return False
    return True


async def test_killed_relay_partitions_move_to_the_survivor(processes: ProcessStack) -> None:
    processes.start("relay-2", kind="relay")
    processes.start("executor")
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
        count = len(frames)
        await eventually(lambda r=ids[i], n=count: _stored(processes, r, n), timeout=20)


async def _stored(stack: ProcessStack, run_id: str, frames: int) -> bool:
    run = await stack.store.get_run_by_id(run_id)
    return bool(run and run.frames_closed and run.frame_count == run.last_seq == frames)
