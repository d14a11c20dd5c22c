"""Scenario 12: one tenant floods, another submits a few runs.

Tenant `flood` submits a burst of short runs, far more than the executor's slots; then
tenant `light` submits runs one at a time and times submit → first frame (its `run`
frame, sent when its attempt starts). The same on two stacks side by side, the same
executor slots: with each tenant's fair share (the default), and with one shared queue
(a share so large that nothing waits for it: first come, first served).
"""

from __future__ import annotations

import asyncio
import time
import uuid

from bench.results import Results
from bench.stack import BASE_SETTINGS, Servers, Stack, progress
from runwire.client import Client
from runwire.contracts.frames import FrameType

SCENARIO = "12 flood"
SLOTS = 16
FLOOD_SCRIPT = {"tokens": ["f"], "token_delay_ms": 50}
LIGHT_SCRIPT = {"tokens": ["ok"]}
LIGHT_RUNS = 30
LIGHT_GAP_S = 0.05
# First come, first served: a share no tenant reaches.
SHARED_QUEUE = 1_000_000


async def _first_frame_ms(client: Client) -> float:
    start = time.perf_counter()
    reply = await client.submit(LIGHT_SCRIPT, request_id=str(uuid.uuid4()))
    first: float | None = None
    async for frame in client.stream(reply.run.run_id):
        if first is None:
            first = (time.perf_counter() - start) * 1000
        if frame.type == FrameType.DONE:
            break
    assert first is not None
    return first


async def _one(srv: Servers, name: str, share: int, flood_runs: int) -> list[float]:
    settings = {**BASE_SETTINGS, "max_in_flight": SLOTS, "tenant_share_runs": share}
    stack = Stack(srv, name, settings, executors=1)
    try:
        await stack.start()
        async with (
            await Client.connect(stack.nats_url, prefix=stack.prefix, tenant="flood") as heavy,
            await Client.connect(stack.nats_url, prefix=stack.prefix, tenant="light") as light,
        ):
            gate = asyncio.Semaphore(256)

            async def submit() -> None:
                async with gate:
                    await heavy.submit(FLOOD_SCRIPT, request_id=str(uuid.uuid4()))

            await asyncio.gather(*(submit() for _ in range(flood_runs)))
            waits: list[float] = []
            tasks = []
            for _ in range(LIGHT_RUNS):
                tasks.append(asyncio.create_task(_first_frame_ms(light)))
                await asyncio.sleep(LIGHT_GAP_S)
            waits = list(await asyncio.wait_for(asyncio.gather(*tasks), timeout=300))
            return waits
    finally:
        await stack.close()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(srv: Servers, results: Results, flood_runs: int) -> None:
    progress(f"{SCENARIO}: {flood_runs} runs of one tenant, {LIGHT_RUNS} of another, {SLOTS} slots")
    fair = await _one(srv, "flood-fair", SLOTS, flood_runs)
    shared = await _one(srv, "flood-shared", SHARED_QUEUE, flood_runs)
    note = f"{flood_runs} runs of 50 ms queued by another tenant; {SLOTS} slots"
    for label, waits in (("fair share", fair), ("one shared queue", shared)):
        results.add(
            SCENARIO,
            f"light tenant first frame p50, {label}",
            round(_percentile(waits, 0.5), 1),
            "ms",
            note,
        )
        results.add(
            SCENARIO,
            f"light tenant first frame p99, {label}",
            round(_percentile(waits, 0.99), 1),
            "ms",
            note,
        )
    results.add(
        SCENARIO,
        "first frame p99, shared queue / fair share",
        round(_percentile(shared, 0.99) / max(_percentile(fair, 0.99), 0.001), 1),
        "x",
    )
