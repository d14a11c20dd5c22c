"""Scenario 5: kill -9 of an executor with runs in flight.

Two executors share the jobs consumer. Runs that emit a token every 40 ms are started
and followed by clients; once every run is running, the executor holding the most of
them is killed with SIGKILL. For each of its runs, the time from the kill to the
resumed attempt's `run` frame (`resumed: true`) at the client is recorded, and the
characters the client had shown that the resumed attempt took back (the `message`
frames after its `resume_after`), beside what resuming from the last heartbeat's text
would have taken back.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from bench.results import Results, percentiles
from bench.stack import Stack, progress
from runwire.contracts.frames import Frame, FrameType
from runwire.contracts.status import RunStatus

TOKENS = 100
TOKEN_DELAY_MS = 40


async def _follow(stack: Stack, run_id: str, seen: list[tuple[float, Frame]]) -> None:
    async for frame in stack.client.stream(run_id):
        seen.append((time.perf_counter(), frame))


async def measure(stack: Stack, results: Results, runs: int) -> None:
    scenario = "5 recovery"
    lease_ttl_ms = int(stack.settings["lease_ttl_ms"])
    progress(f"{scenario}: {runs} runs on 2 executors, kill -9 of one")
    script: dict[str, Any] = {
        "tokens": [f"t{i} " for i in range(TOKENS)],
        "token_delay_ms": TOKEN_DELAY_MS,
    }
    ids = [
        (await stack.client.submit(script, request_id=str(uuid.uuid4()))).run.run_id
        for _ in range(runs)
    ]
    frames: dict[str, list[tuple[float, Frame]]] = {r: [] for r in ids}
    followers = [asyncio.create_task(_follow(stack, r, frames[r])) for r in ids]
    deadline = time.monotonic() + 30
    while not all(len(f) >= 3 for f in frames.values()):
        if time.monotonic() > deadline:
            raise TimeoutError("runs did not start streaming")
        await asyncio.sleep(0.05)
    owners = await stack.db.fetch(
        "SELECT run_id::text AS run_id, lease_owner FROM runs"
        " WHERE run_id = ANY($1::uuid[]) AND status = 'running'",
        ids,
    )
    by_owner: dict[str, list[str]] = {}
    for row in owners:
        by_owner.setdefault(row["lease_owner"], []).append(row["run_id"])
    victim_owner, victims = max(by_owner.items(), key=lambda kv: len(kv[1]))
    victim = victim_owner.removeprefix("bench-")
    killed_at = time.perf_counter()
    stack.procs[victim].kill()
    heartbeats = {
        r["run_id"]: len(r["partial_text"])
        for r in await stack.db.fetch(
            "SELECT run_id::text AS run_id, partial_text FROM runs WHERE run_id = ANY($1::uuid[])",
            victims,
        )
    }
    progress(f"{scenario}: killed {victim} holding {len(victims)} runs")
    await asyncio.wait_for(asyncio.gather(*followers), timeout=lease_ttl_ms / 1000 + 60)
    delays: list[float] = []
    for run_id in victims:
        resumed = [
            at
            for at, f in frames[run_id]
            if f.type == FrameType.RUN and f.data.get("resumed") and at > killed_at
        ]
        if resumed:
            delays.append((resumed[0] - killed_at) * 1000)
    taken_back: list[int] = []
    heartbeat_taken_back: list[int] = []
    for run_id in victims:
        seen = [f for _, f in frames[run_id]]
        cut = next((f for f in seen if f.type == FrameType.RUN and f.data.get("resumed")), None)
        if cut is None:
            continue
        shown = [f for f in seen if f.type == FrameType.MESSAGE and f.seq < cut.seq]
        shown_chars = sum(len(f.data["text"]) for f in shown)
        kept = sum(len(f.data["text"]) for f in shown if f.seq <= cut.data["resume_after"])
        taken_back.append(shown_chars - kept)
        heartbeat_taken_back.append(max(0, shown_chars - heartbeats.get(run_id, 0)))
    statuses = await stack.db.fetch(
        "SELECT status::text AS status, count(*) AS n FROM runs"
        " WHERE run_id = ANY($1::uuid[]) GROUP BY status",
        ids,
    )
    finished = sum(r["n"] for r in statuses if r["status"] == RunStatus.FINISHED.value)
    found = percentiles(delays)
    note = f"lease TTL {lease_ttl_ms} ms, heartbeat {stack.settings['heartbeat_ms']} ms"
    results.add(scenario, "runs on the killed executor", len(victims), "runs")
    results.add(scenario, "runs resumed elsewhere", len(delays), "runs")
    results.add(scenario, "kill → resumed run frame p50", found["p50"], "ms", note)
    results.add(
        scenario,
        "kill → resumed run frame max",
        round(max(delays), 1) if delays else None,
        "ms",
        note,
    )
    results.add(
        scenario,
        "characters taken back on resume, max per run",
        max(taken_back) if taken_back else None,
        "chars",
        f"total {sum(taken_back)} over {len(taken_back)} runs",
    )
    results.add(
        scenario,
        "… had it resumed from the last heartbeat, max per run",
        max(heartbeat_taken_back) if heartbeat_taken_back else None,
        "chars",
        f"total {sum(heartbeat_taken_back)}; heartbeat every {stack.settings['heartbeat_ms']} ms",
    )
    results.add(scenario, "runs finished in the end", f"{finished} of {len(ids)}", "runs")
    results.latency_samples["runwire recovery (kill → resumed)"] = delays
    progress(f"{scenario}: resumed p50 {found['p50']} ms, {len(delays)}/{len(victims)} resumed")
