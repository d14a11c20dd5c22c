"""Scenario 4: re-joining a finished 10k-frame run, from the stream and from Postgres.

The run is streamed once to its end; then a fresh `Client.stream(run_id, 0)` is timed
to its last frame, first while the client frames stream still holds the run, then
after the run's subject is purged from it, so that the relay replays from Postgres
segments alone.
"""

from __future__ import annotations

import statistics
import time
import uuid

from bench.results import Results
from bench.stack import Stack, progress
from bench.streaming import wait_frames_closed
from runwire.contracts.frames import FrameType

REPEATS = 3


async def replay_ms(stack: Stack, run_id: str, expected: int) -> float:
    """Time of one full replay from cursor 0 to `done`, in ms."""
    start = time.perf_counter()
    seen = 0
    async for frame in stack.client.stream(run_id):
        seen += 1
        if frame.type == FrameType.DONE:
            break
    elapsed = (time.perf_counter() - start) * 1000
    if seen != expected:
        raise RuntimeError(f"replay of {run_id} gave {seen} frames, expected {expected}")
    return elapsed


async def measure(stack: Stack, results: Results, frames: int) -> None:
    scenario = "4 re-join"
    progress(f"{scenario}: a finished {frames}-frame run, replayed")
    reply = await stack.client.submit({"tokens": ["y"] * frames}, request_id=str(uuid.uuid4()))
    run_id = reply.run.run_id
    async for frame in stack.client.stream(run_id):
        if frame.type == FrameType.DONE:
            break
    await wait_frames_closed(stack, run_id)
    total = int(
        await stack.db.fetchval("SELECT last_seq FROM runs WHERE run_id = $1::uuid", run_id)
    )
    from_stream = [await replay_ms(stack, run_id, total) for _ in range(REPEATS)]
    js = stack.client.nc.jetstream()
    subjects = stack.client.subjects
    await js.purge_stream(
        subjects.run_frames_stream, subject=subjects.run_frames(stack.client.tenant, run_id)
    )
    from_postgres = [await replay_ms(stack, run_id, total) for _ in range(REPEATS)]
    note = f"median of {REPEATS}; {total} frames in all"
    results.add(
        scenario,
        "replay to last frame, stream intact",
        round(statistics.median(from_stream), 1),
        "ms",
        note,
    )
    results.add(
        scenario,
        "replay to last frame, subject purged (Postgres only)",
        round(statistics.median(from_postgres), 1),
        "ms",
        note,
    )
    progress(
        f"{scenario}: {statistics.median(from_stream):.0f} ms (stream), "
        f"{statistics.median(from_postgres):.0f} ms (Postgres)"
    )
