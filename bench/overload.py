"""Scenario 7: more runs than `max_in_flight` and the queue capacity allow.

A burst of short runs is submitted to a stack with a small in-flight limit and a
small jobs queue. Submits beyond the queue answer `QUEUE_FULL`; the run_events log
shows how many attempts ran at once; every accepted run must finish and every
refused one must be recorded failed with `QUEUE_FULL`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from bench.results import Results
from bench.stack import Stack, progress
from runwire.client import ClientError
from runwire.contracts.errors import ErrorCode

ATTEMPT_ENDS = {"finished", "failed", "canceled", "retry", "released", "recovering", "interrupted"}
TERMINAL = ("finished", "failed", "canceled", "interrupted")


def max_running(events: list[Any]) -> int:
    """The most attempts running at one moment, from run_events in order."""
    running: set[str] = set()
    peak = 0
    for event in events:
        if event["event"] == "claimed":
            running.add(event["run_id"])
        elif event["event"] in ATTEMPT_ENDS:
            running.discard(event["run_id"])
        peak = max(peak, len(running))
    return peak


async def measure(stack: Stack, results: Results, runs: int) -> None:
    scenario = "7 overload"
    limit = int(stack.settings["max_in_flight"])
    capacity = int(stack.settings["queue_capacity"])
    tag = f"ovl-{uuid.uuid4().hex[:8]}-"
    progress(f"{scenario}: {runs} runs against max_in_flight {limit}, queue capacity {capacity}")
    script = {"tokens": ["a", "b", "c", "d", "e"], "token_delay_ms": 20}
    accepted: list[str] = []
    refused: dict[str, int] = {}
    gate = asyncio.Semaphore(256)

    async def one(i: int) -> None:
        async with gate:
            try:
                reply = await stack.client.submit(script, request_id=f"{tag}{i}")
            except ClientError as exc:
                refused[str(exc.code)] = refused.get(str(exc.code), 0) + 1
                return
            accepted.append(reply.run.run_id)

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(runs)))
    await stack.wait_terminal(accepted, timeout=120)
    elapsed = time.perf_counter() - start
    events = await stack.db.fetch(
        "SELECT e.run_id::text AS run_id, e.event FROM run_events e JOIN runs r USING (run_id)"
        " WHERE r.request_id LIKE $1 ORDER BY e.at, e.id",
        f"{tag}%",
    )
    rows = await stack.db.fetch(
        "SELECT status::text AS status, error->>'code' AS code, count(*) AS n FROM runs"
        " WHERE request_id LIKE $1 GROUP BY 1, 2 ORDER BY 1, 2",
        f"{tag}%",
    )
    by_status = {(r["status"], r["code"]): int(r["n"]) for r in rows}
    finished = by_status.get(("finished", None), 0)
    recorded_full = by_status.get(("failed", ErrorCode.QUEUE_FULL.value), 0)
    full = refused.get(str(ErrorCode.QUEUE_FULL), 0)
    stored = sum(by_status.values())
    peak = max_running(events)
    lost = runs - stored
    results.add(scenario, "runs submitted", runs, "runs")
    results.add(scenario, "accepted", len(accepted), "runs")
    results.add(scenario, "QUEUE_FULL answers", full, "submits")
    other = {k: v for k, v in refused.items() if k != str(ErrorCode.QUEUE_FULL)}
    if other:
        results.add(scenario, "other refusals", str(other), "submits")
    results.add(scenario, "most attempts running at once", peak, "attempts", f"limit {limit}")
    results.add(scenario, "in-flight never above the limit", "yes" if peak <= limit else "NO", "")
    results.add(scenario, "accepted runs finished", f"{finished} of {len(accepted)}", "runs")
    results.add(
        scenario, "refused runs recorded failed QUEUE_FULL", f"{recorded_full} of {full}", "runs"
    )
    results.add(
        scenario,
        "runs lost (submitted, not in Postgres)",
        lost,
        "runs",
        ", ".join(f"{s}/{c or '-'}={n}" for (s, c), n in by_status.items()),
    )
    results.add(scenario, "burst submitted → all accepted runs terminal", round(elapsed, 2), "s")
    progress(f"{scenario}: {len(accepted)} accepted, {full} QUEUE_FULL, peak in flight {peak}")
