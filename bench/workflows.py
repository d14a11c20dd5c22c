"""Scenario 8: workflow runs of a 10-node graph (one node, eight side by side, one that
joins them), and a 10-node chain against a bare run: node transitions per second, and
what a node costs beyond the run it is.

Each node is a scripted run of one token. Node transitions are the workflow runs' node
events (ready, started, completed: three a node), counted in Postgres. A node's overhead
is the chain's time (from its submit to its end, as Postgres recorded them) less the time
spent inside its node runs (each from its first claim to its end), shared among its
nodes: the nodes of a chain run one after the other inside the chain's time, so it is
never negative. (A bare run's submit → done is no yardstick: it also pays the client's
submit and join, which a chain pays once for all its nodes.)
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
import uuid
from typing import Any

from bench.results import Results
from bench.stack import Stack, progress
from runwire.contracts.frames import FrameType

FAN = 8
CHAIN = 10
REPEATS = 5


def _node(node_id: str) -> dict[str, Any]:
    return {"id": node_id, "runner": "scripted", "input": {"tokens": [node_id]}}


def fan_graph() -> dict[str, Any]:
    middle = [f"part-{i}" for i in range(FAN)]
    return {
        "nodes": [_node("split"), *(_node(m) for m in middle), _node("join")],
        "edges": [{"from": "split", "to": m} for m in middle]
        + [{"from": m, "to": "join"} for m in middle],
    }


def chain_graph() -> dict[str, Any]:
    ids = [f"step-{i}" for i in range(CHAIN)]
    return {
        "nodes": [_node(i) for i in ids],
        "edges": [{"from": a, "to": b} for a, b in itertools.pairwise(ids)],
    }


async def _to_done(stack: Stack, run_id: str) -> str:
    async for frame in stack.client.stream(run_id):
        if frame.type == FrameType.DONE:
            return str(frame.data["status"])
    raise RuntimeError(f"the stream of {run_id} ended without done")


async def _timed(stack: Stack, submit: Any) -> tuple[float, str]:
    start = time.perf_counter()
    reply = await submit()
    status = await _to_done(stack, reply.run.run_id)
    if status != "finished":
        raise RuntimeError(f"run {reply.run.run_id} ended {status}")
    return (time.perf_counter() - start) * 1000, reply.run.run_id


async def node_overhead_ms(db: Any, run_id: str) -> tuple[float, float]:
    """A finished chain's (time, overhead per node) in ms: its time from submit to end,
    and that time less the time inside its node runs, per node (see the module)."""
    row = await db.fetchrow(
        """SELECT extract(epoch FROM w.ended_at - w.created_at) * 1000 AS total,
                  (SELECT extract(epoch FROM sum(n.ended_at - n.started_at)) * 1000
                     FROM runs n WHERE n.parent_run_id = w.run_id) AS inside,
                  (SELECT count(*) FROM runs n WHERE n.parent_run_id = w.run_id) AS nodes
             FROM runs w WHERE w.run_id = $1 AND w.status = 'finished'""",
        uuid.UUID(run_id),
    )
    if row is None or not row["nodes"]:
        raise RuntimeError(f"run {run_id} is not a finished workflow run")
    total, inside = float(row["total"]), float(row["inside"])
    return total, (total - inside) / int(row["nodes"])


async def measure(stack: Stack, results: Results, workflows: int) -> None:
    scenario = "8 workflows"
    tag = uuid.uuid4().hex[:8]
    await stack.client.release(f"fan-{tag}", 1, fan_graph())
    await stack.client.release(f"chain-{tag}", 1, chain_graph())
    progress(f"{scenario}: {workflows} runs of a {FAN + 2}-node graph at once")

    start = time.perf_counter()
    replies = await asyncio.gather(
        *(stack.client.submit_workflow(f"fan-{tag}", {}) for _ in range(workflows))
    )
    statuses = await asyncio.gather(*(_to_done(stack, r.run.run_id) for r in replies))
    elapsed = time.perf_counter() - start
    finished = sum(s == "finished" for s in statuses)
    transitions = int(
        await stack.db.fetchval(
            "SELECT count(*) FROM run_events WHERE run_id = ANY($1::uuid[]) AND seq IS NOT NULL",
            [r.run.run_id for r in replies],
        )
    )
    results.add(scenario, "workflow runs finished", f"{finished} of {workflows}", "runs")
    results.add(scenario, "node runs", workflows * (FAN + 2), "nodes")
    results.add(scenario, "node transitions", transitions, "events")
    results.add(scenario, "node transitions per second", round(transitions / elapsed), "/s")
    results.add(scenario, "nodes per second", round(workflows * (FAN + 2) / elapsed), "/s")

    progress(f"{scenario}: a {CHAIN}-node chain against a bare run, {REPEATS} times each")
    bare = [
        (await _timed(stack, lambda: stack.client.submit({"tokens": ["x"]})))[0]
        for _ in range(REPEATS)
    ]
    chained = [
        await _timed(stack, lambda: stack.client.submit_workflow(f"chain-{tag}", {}))
        for _ in range(REPEATS)
    ]
    chain = [ms for ms, _ in chained]
    per_node = statistics.median(chain) / CHAIN
    overheads = [(await node_overhead_ms(stack.db, run_id))[1] for _, run_id in chained]
    note = f"median of {REPEATS}, one at a time"
    results.add(scenario, "bare run, submit → done", round(statistics.median(bare), 1), "ms", note)
    results.add(
        scenario,
        f"{CHAIN}-node chain, submit → done",
        round(statistics.median(chain), 1),
        "ms",
        note,
    )
    overhead = statistics.median(overheads)
    results.add(
        scenario,
        "overhead per node",
        round(overhead, 1),
        "ms",
        f"(chain time - time inside its node runs) / {CHAIN}, in Postgres; {note}",
    )
    progress(
        f"{scenario}: {transitions / elapsed:.0f} node transitions/s; a node costs "
        f"{per_node:.1f} ms in a chain ({overhead:.1f} ms of it beyond its run), a bare run "
        f"{statistics.median(bare):.1f} ms"
    )
