"""Scenario 9: Server-Sent Events through the gateway (a process, as deployed): frames
per second to one and to 100 SSE clients of one run, and what the gateway adds to the
first frame over the SDK's own join.

A finished run is read from its first frame to `done`, over HTTP by the SSE clients at
once, and by the SDK over NATS for comparison; then runs are submitted one at a time and
timed to their first text frame, through the gateway (POST, then the event stream) and
through the SDK (submit, then join), alternately.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
import uuid
from pathlib import Path

import httpx

from bench.results import Results
from bench.stack import Stack, progress
from bench.streaming import wait_frames_closed
from runwire.contracts.frames import FrameType
from runwire.gateway.keys import add_key, new_key
from runwire.infra.processes import find_free_port

FRAMES = 5_000
CLIENTS = 100
FIRST_FRAME_RUNS = 20


async def start_gateway(stack: Stack, folder: Path) -> tuple[str, str]:
    """A gateway process beside the stack's services; its URL and an API key."""
    key = new_key()
    keys = folder / f"api-keys-{stack.name}.json"
    add_key(keys, "default", key)
    port = find_free_port()
    # Every SSE client of the scenario is one key's: the gateway's limit per key (64 open
    # requests by default) would refuse the rest with 429.
    stack.start_service(
        "gateway",
        gateway_port=port,
        gateway_keys_file=keys,
        gateway_max_requests_per_key=CLIENTS + 16,
    )
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient() as http:
        for _ in range(300):
            stack.check_alive()
            try:
                if (await http.get(f"{url}/healthz")).status_code == 200:
                    return url, key
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
    raise TimeoutError(f"the gateway did not answer:\n{stack.logs()}")


async def _read_sse(http: httpx.AsyncClient, url: str, key: str, run_id: str) -> int:
    """Every event of the run's stream to `done`; how many frames."""
    seen = 0
    headers = {"Authorization": f"Bearer {key}"}
    async with http.stream("GET", f"{url}/v1/runs/{run_id}/frames", headers=headers) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                seen += 1
                if '"type":"done"' in line:
                    break
    return seen


async def _first_text_over_http(http: httpx.AsyncClient, url: str, key: str) -> float:
    headers = {"Authorization": f"Bearer {key}"}
    start = time.perf_counter()
    body = {"request_id": str(uuid.uuid4()), "input": {"tokens": ["first", " frame"]}}
    run_id = (await http.post(f"{url}/v1/runs", json=body, headers=headers)).json()["run"]["run_id"]
    async with http.stream("GET", f"{url}/v1/runs/{run_id}/frames", headers=headers) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: ") and json.loads(line[6:])["type"] == "message":
                return (time.perf_counter() - start) * 1000
    raise RuntimeError("no text frame")


async def _first_text_over_nats(stack: Stack) -> float:
    start = time.perf_counter()
    reply = await stack.client.submit({"tokens": ["first", " frame"]})
    async for frame in stack.client.stream(reply.run.run_id):
        if frame.type == FrameType.MESSAGE:
            return (time.perf_counter() - start) * 1000
    raise RuntimeError("no text frame")


async def measure(stack: Stack, results: Results, folder: Path) -> None:
    scenario = "9 SSE through the gateway"
    url, key = await start_gateway(stack, folder)
    reply = await stack.client.submit({"tokens": ["y"] * FRAMES})
    run_id = reply.run.run_id
    async for frame in stack.client.stream(run_id):
        if frame.type == FrameType.DONE:
            break
    await wait_frames_closed(stack, run_id)
    total = FRAMES + 2
    progress(f"{scenario}: a finished {total}-frame run to 1 and to {CLIENTS} SSE clients")
    limits = httpx.Limits(max_connections=CLIENTS + 10)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        start = time.perf_counter()
        assert await _read_sse(http, url, key, run_id) == total
        one = time.perf_counter() - start
        start = time.perf_counter()
        counts = await asyncio.gather(*(_read_sse(http, url, key, run_id) for _ in range(CLIENTS)))
        many = time.perf_counter() - start
        start = time.perf_counter()
        async for frame in stack.client.stream(run_id):
            if frame.type == FrameType.DONE:
                break
        sdk = time.perf_counter() - start
        complete = sum(c == total for c in counts)
        results.add(scenario, "frames/s to one SSE client", round(total / one), "frames/s")
        results.add(
            scenario, "frames/s to one SDK client (NATS), same run", round(total / sdk), "frames/s"
        )
        results.add(
            scenario,
            f"frames/s to {CLIENTS} SSE clients at once (sum)",
            round(sum(counts) / many),  # what arrived, not what was asked for
            "frames/s",
            f"{complete} of {CLIENTS} got every frame",
        )
        progress(f"{scenario}: first text frame, {FIRST_FRAME_RUNS} runs each way")
        http_ms, nats_ms = [], []
        for _ in range(FIRST_FRAME_RUNS):
            http_ms.append(await _first_text_over_http(http, url, key))
            nats_ms.append(await _first_text_over_nats(stack))
    results.add_percentiles(scenario, "submit → first text frame, over the gateway", http_ms)
    results.add_percentiles(scenario, "submit → first text frame, SDK over NATS", nats_ms)
    added = statistics.median(http_ms) - statistics.median(nats_ms)
    results.add(scenario, "gateway's added latency to the first frame (p50)", round(added, 1), "ms")
    progress(
        f"{scenario}: {total / one:.0f} frames/s to one client, "
        f"{total * CLIENTS / many:.0f} to {CLIENTS}; +{added:.1f} ms to the first frame"
    )
