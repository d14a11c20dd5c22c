"""Scenario 3 (and the memory half of 6): one run streaming many small text deltas.

One `scripted` run emits N one-character `message` deltas without delay; a client
follows it with `Client.stream`. Measured twice:

- as runwire runs by default: deltas emitted while the run's previous frame is on its
  way to the stream join into one frame (`coalesce_text`), so the client gets the same
  text in fewer, larger frames. The figure is the deltas (the runner's `message`
  frames) per second at the client, from the submit to the last of them.
- one frame per delta (an executor with RUNWIRE_COALESCE_TEXT=false): what the frame
  pipeline itself carries, counted at the client from the first frame to the last,
  for two run lengths, so that the services' peak memory can be compared (it should
  not grow with a run's length).

The relay's Postgres writes are the run's rows in `frame_segments` (one per flush).
"""

from __future__ import annotations

import asyncio
import time
import uuid

from bench.results import Results
from bench.stack import Stack, progress
from runwire.contracts.frames import FrameType


async def stream_run(stack: Stack, deltas: int) -> dict[str, float]:
    """Stream one run of `deltas` one-character text deltas; return what was measured."""
    script = {"tokens": ["x"] * deltas}
    start = time.perf_counter()
    reply = await stack.client.submit(script, request_id=str(uuid.uuid4()))
    run_id = reply.run.run_id
    first = last = 0.0
    frames = chars = 0
    async for frame in stack.client.stream(run_id):
        if frame.type == FrameType.MESSAGE:
            now = time.perf_counter()
            if frames == 0:
                first = now
            last = now
            frames += 1
            chars += len(frame.data["text"])
    done = time.perf_counter()
    if chars != deltas:
        raise AssertionError(f"the client got {chars} of the run's {deltas} characters")
    await wait_frames_closed(stack, run_id)
    writes = await stack.db.fetchval(
        "SELECT count(*) FROM frame_segments WHERE run_id = $1::uuid", run_id
    )
    total = await stack.db.fetchval("SELECT last_seq FROM runs WHERE run_id = $1::uuid", run_id)
    return {
        "message_frames": frames,
        "frames_per_s": frames / max(1e-9, last - first),
        "deltas_per_s": deltas / max(1e-9, last - start),
        "submit_to_done_s": done - start,
        "segment_writes": float(writes or 0),
        "frames_total": float(total or 0),
    }


async def wait_frames_closed(stack: Stack, run_id: str, timeout: float = 120.0) -> None:
    """Until the relay has written the run's last segment (`done` included)."""
    deadline = time.monotonic() + timeout
    while not await stack.db.fetchval(
        "SELECT frames_closed FROM runs WHERE run_id = $1::uuid", run_id
    ):
        if time.monotonic() > deadline:
            raise TimeoutError(f"frames of run {run_id} not closed after {timeout} s")
        await asyncio.sleep(0.05)


async def measure_coalesced(stack: Stack, results: Results, long: int) -> None:
    """The one fast stream, as runwire runs by default."""
    scenario = "3 streaming"
    progress(f"{scenario}: one run of {long} text deltas, coalesced (the default)")
    found = await stream_run(stack, long)
    results.add(
        scenario,
        f"text deltas per second at the client ({long} deltas)",
        round(found["deltas_per_s"]),
        "deltas/s",
        "the one fast stream: 50,000/s is the target; submit → the last delta at the client",
    )
    results.add(
        scenario,
        f"frames that carried them ({long} deltas)",
        int(found["message_frames"]),
        "frames",
        "deltas emitted while the previous frame was on its way join it",
    )
    took = round(found["submit_to_done_s"], 2)
    results.add(scenario, f"submit → done ({long} deltas)", took, "s")
    results.add(
        scenario,
        f"Postgres segment writes by the relay ({long} deltas)",
        int(found["segment_writes"]),
        "rows",
    )
    rate, carried = found["deltas_per_s"], found["message_frames"]
    progress(f"{scenario}: {rate:.0f} deltas/s in {carried} frames")


async def measure_per_delta(stack: Stack, results: Results, long: int, short: int) -> None:
    """The frame pipeline itself: one frame per delta (the stack's executor runs with
    RUNWIRE_COALESCE_TEXT=false), and the services' memory over two run lengths."""
    scenario = "3 streaming"
    peaks: dict[int, dict[str, float]] = {}
    for frames in (short, long):
        progress(f"{scenario}: one run of {frames} message frames, one per delta")
        stack.sampler.begin(f"streaming {frames}")
        found = await stream_run(stack, frames)
        peaks[frames] = stack.sampler.end()
        label = f"{frames} frames, one per delta"
        results.add(
            scenario,
            f"frames per second at the client ({label})",
            round(found["frames_per_s"]),
            "frames/s",
        )
        results.add(scenario, f"submit → done ({label})", round(found["submit_to_done_s"], 2), "s")
        results.add(
            scenario,
            f"Postgres segment writes by the relay ({label})",
            int(found["segment_writes"]),
            "rows",
        )
        results.add(
            scenario,
            f"frames per segment write ({label})",
            round(found["frames_total"] / max(1.0, found["segment_writes"]), 1),
            "frames/row",
        )
        progress(
            f"{scenario}: {found['frames_per_s']:.0f} frames/s, "
            f"{int(found['segment_writes'])} segment writes"
        )
    for frames, by_service in peaks.items():
        for name, mib in by_service.items():
            results.add(
                "6 memory", f"peak RSS {name}, streaming {frames} frames", round(mib, 1), "MiB"
            )
    for name in ("relay", "executor-1"):
        small, big = peaks[short].get(name), peaks[long].get(name)
        if small and big:
            results.add(
                "6 memory",
                f"{name} peak growth {short} → {long} frames",
                round(big - small, 1),
                "MiB",
                "flat means near 0",
            )
