"""Scenario 2: latency at a fixed submit rate.

Runs are submitted on a fixed schedule (e.g. 50/s, then 200/s); for each one the client
times submit → reply, submit → first frame (through `Client.stream`) and submit → `done`
at the client, and Postgres gives submit → run terminal (`ended_at`), the figure that
compares with the peers, which have no frames.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field

from bench.results import Results
from bench.stack import Stack, progress
from bench.throughput import NOOP_INPUT
from runwire.client import ClientError
from runwire.contracts.frames import FrameType


@dataclass
class Timings:
    """Per-run latencies in ms, and what went wrong."""

    reply: list[float] = field(default_factory=list)
    first_frame: list[float] = field(default_factory=list)
    done: list[float] = field(default_factory=list)
    terminal: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    achieved_rate: float = 0.0


async def run_at_rate(stack: Stack, rate: float, seconds: float) -> Timings:
    """Submit `rate` runs per second for `seconds`, following each to `done`."""
    out = Timings()
    submitted: dict[str, float] = {}
    count = max(1, int(rate * seconds))

    async def one() -> None:
        wall = time.time()
        start = time.perf_counter()
        try:
            reply = await stack.client.submit(NOOP_INPUT, request_id=str(uuid.uuid4()))
        except ClientError as exc:
            out.errors[str(exc.code)] = out.errors.get(str(exc.code), 0) + 1
            return
        out.reply.append((time.perf_counter() - start) * 1000)
        run_id = reply.run.run_id
        submitted[run_id] = wall
        first = True
        async for frame in stack.client.stream(run_id):
            if first:
                out.first_frame.append((time.perf_counter() - start) * 1000)
                first = False
            if frame.type == FrameType.DONE:
                out.done.append((time.perf_counter() - start) * 1000)

    tasks: list[asyncio.Task[None]] = []
    begin = time.perf_counter()
    for i in range(count):
        delay = begin + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one()))
    out.achieved_rate = count / max(1e-9, time.perf_counter() - begin)
    # Generous: when the relay falls behind, `done` reaches clients long after the runs end.
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=600)
    rows = await stack.db.fetch(
        "SELECT run_id::text AS run_id, extract(epoch FROM ended_at) AS ended FROM runs"
        " WHERE run_id = ANY($1::uuid[]) AND ended_at IS NOT NULL",
        list(submitted),
    )
    out.terminal = [(float(r["ended"]) - submitted[r["run_id"]]) * 1000 for r in rows]
    return out


async def measure(stack: Stack, results: Results, rates: list[int], seconds: float) -> None:
    """Run each rate in turn and record the percentiles."""
    for rate in rates:
        scenario = f"2 latency at {rate} runs/s (runwire)"
        progress(f"{scenario}: {seconds:.0f} s")
        found = await run_at_rate(stack, rate, seconds)
        results.add(scenario, "runs", len(found.done), "runs")
        results.add(scenario, "achieved submit rate", round(found.achieved_rate, 1), "runs/s")
        results.add_percentiles(scenario, "submit → reply", found.reply)
        p = results.add_percentiles(scenario, "submit → first frame", found.first_frame)
        results.add_percentiles(scenario, "submit → done (client)", found.done)
        results.add_percentiles(scenario, "submit → terminal in Postgres", found.terminal)
        if found.errors:
            results.add(scenario, "failed submits", str(found.errors), "submits")
        results.latency_samples[f"runwire {rate}/s done (client)"] = found.done
        results.latency_samples[f"runwire {rate}/s first frame"] = found.first_frame
        results.latency_samples[f"runwire {rate}/s terminal"] = found.terminal
        progress(f"{scenario}: first frame p50 {p['p50']} ms, p99 {p['p99']} ms")
        await asyncio.sleep(0.5)
