"""Scenario 1: throughput of no-op runs, from the first submit to the last run terminal.

One client submits N `scripted` runs of one token with up to 256 requests outstanding;
the clock stops at the latest `ended_at` in Postgres once every run is terminal.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from bench.cpu import CpuClock
from bench.results import Results
from bench.stack import Stack, progress
from runwire.client import Client, ClientError

OUTSTANDING = 256
NOOP_INPUT: dict[str, Any] = {"tokens": ["x"]}


@dataclass
class Submitted:
    """What a burst of submits produced."""

    run_ids: list[str] = field(default_factory=list)
    rejected: dict[str, int] = field(default_factory=dict)
    first_submit: float = 0.0
    last_reply: float = 0.0


async def submit_many(
    client: Client,
    n: int,
    script: dict[str, Any] = NOOP_INPUT,
    outstanding: int = OUTSTANDING,
    **options: Any,
) -> Submitted:
    """Submit `n` runs with at most `outstanding` requests in flight; `options` are
    the submit command's (`runner=...`)."""
    out = Submitted()
    gate = asyncio.Semaphore(outstanding)

    async def one() -> None:
        async with gate:
            try:
                reply = await client.submit(script, request_id=str(uuid.uuid4()), **options)
            except ClientError as exc:
                out.rejected[str(exc.code)] = out.rejected.get(str(exc.code), 0) + 1
                return
            out.run_ids.append(reply.run.run_id)

    out.first_submit = time.time()
    await asyncio.gather(*(one() for _ in range(n)))
    out.last_reply = time.time()
    return out


async def measure(
    stack: Stack, results: Results, label: str, n: int, *, round_no: int | None = None
) -> float:
    """Run the throughput workload on `stack`; record and return runs per second.

    One of several rounds (`round_no`): its rate is recorded as that round's, its other
    figures in the first round only, and the caller records the rounds' median."""
    scenario = f"1 throughput ({label})"
    suffix = f" (round {round_no})" if round_no is not None else ""
    progress(f"{scenario}: {n} no-op runs, {OUTSTANDING} outstanding{suffix}")
    stack.sampler.begin(f"throughput {label}")
    clock = machine_clock(stack)
    cpu_before = clock.read()
    sent = await submit_many(stack.client, n)
    last_end = await stack.wait_terminal(sent.run_ids, timeout=max(120.0, n / 20))
    await stack.wait_relayed(sent.run_ids, timeout=max(120.0, n / 10))
    relayed = time.time() - sent.first_submit
    cpu_after = clock.read()
    peaks = stack.sampler.end()
    elapsed = last_end - sent.first_submit
    rate = len(sent.run_ids) / elapsed if elapsed > 0 else 0.0
    statuses = await stack.db.fetch(
        "SELECT status::text AS status, count(*) AS n FROM runs WHERE run_id = ANY($1::uuid[])"
        " GROUP BY status",
        sent.run_ids,
    )
    results.add(scenario, f"runs finished per second{suffix}", round(rate, 1), "runs/s")
    progress(f"{scenario}: {rate:.0f} runs/s{suffix}")
    if round_no is not None and round_no > 1:
        return rate
    results.add(scenario, "runs", len(sent.run_ids), "runs")
    results.add(scenario, "first submit → last run terminal", round(elapsed, 2), "s")
    results.add(
        scenario,
        "first submit → every run's `done` relayed",
        round(relayed, 2),
        "s",
        "the relay's lag behind the executor",
    )
    submit_rate = len(sent.run_ids) / max(1e-9, sent.last_reply - sent.first_submit)
    results.add(scenario, "submits answered per second", round(submit_rate, 1), "submits/s")
    used = {name: (cpu_after[name] - cpu_before[name]) * 1e6 / n for name in cpu_after}
    results.add(
        scenario,
        "machine CPU per run",
        round(sum(used.values())),
        "µs/run",
        "the services, nats-server and Postgres (the client excluded): "
        + ", ".join(f"{name} {us:.0f}" for name, us in sorted(used.items())),
    )
    results.add(
        scenario,
        "terminal statuses",
        ", ".join(f"{r['status']}={r['n']}" for r in statuses),
        "runs",
    )
    if sent.rejected:
        results.add(scenario, "submits rejected", str(sent.rejected), "submits")
    for name, mib in peaks.items():
        results.add(
            "6 memory", f"peak RSS {name}, during throughput ({label})", round(mib, 1), "MiB"
        )
    if round_no is None:
        results.throughput[f"runwire ({label})"] = round(rate, 1)
    return rate


def machine_clock(stack: Stack) -> CpuClock:
    """CPU of the stack's services, nats-server and Postgres (all its processes)."""
    nats_pid, pg_pid = stack.servers.nats.pid, stack.servers.postgres.pid
    assert nats_pid is not None
    assert pg_pid is not None
    services = {name: proc.pid for name, proc in stack.procs.items()}
    return CpuClock(single={**services, "nats-server": nats_pid}, trees={"postgres": pg_pid})


async def warm_up(stack: Stack, runs: int = 20) -> None:
    """A few runs end to end, so that connections and caches are warm."""
    sent = await submit_many(stack.client, runs)
    await stack.wait_terminal(sent.run_ids, timeout=60)
    if sent.run_ids:
        async for _ in stack.client.stream(sent.run_ids[-1]):
            pass
    await asyncio.sleep(0.2)
