"""Scenario 11: runs that wait (issue 36), on a stack of its own.

A run of `bench_asks` (bench/wait_runner.py) asks at once: its attempt ends with a
`wait` frame and the run waits, holding no lease and no executor slot. Measured, on an
otherwise idle stack:

- resume → the next attempt's first frame (its `run` frame) as a client following the
  run sees it, one resume at a time: the client follows the run until its `wait`
  frame, then the clock starts and `Client.resume` answers;
- then the same stack with N runs waiting (10,000 quick, 100,000 full), made through
  the real path (submits of `bench_asks`, each attempt ending to wait, every wait with
  a timeout so that each is in recovery's index of due waits), side by side with the
  stack before they were made: CPU per second of each service process, of nats-server,
  of Postgres and of the Postgres backends serving recovery's connections, over an
  idle window; RSS of each process; Postgres's private memory and the size of the
  tables that hold runs and their waits; the time of recovery's statements that read
  waits (`time_out_waits` and `queue_stats` at each tick, `waiting_stats` every
  `waiting_gauges_interval_ms`), run as recovery runs them; submit →
  first frame of fresh runs; resume → first frame again.

`python -m bench.waits` runs this scenario alone (its own servers) and prints its table;
`BENCH_WAITING=N` and `BENCH_RESUMES=N` change its sizes.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import psutil

from bench import latency, report, throughput
from bench.cpu import CpuClock, private_mib
from bench.results import Results, percentiles
from bench.stack import BASE_SETTINGS, Servers, Stack, progress, servers
from runwire.contracts.frames import FrameType
from runwire.runtime.settings import RecoverySettings
from runwire.runtime.store.schema import QUERIES

SCENARIO = "11 waits"
RUNNER = "bench_asks"
RUNNERS = f"{RUNNER}=bench.wait_runner:asks"
# Long enough never to come during the bench: each wait is in the due index all along.
WAIT_TIMEOUT_S = 3600
WAIT_INPUT: dict[str, Any] = {"timeout": WAIT_TIMEOUT_S}
# The idle window CPU is measured over, with and without the waiting runs.
IDLE_WINDOW_S = 8.0
# Fresh runs' submit → first frame: as scenario 2 at 50 runs/s, for a few seconds.
FRESH_RATE = 50
FRESH_SECONDS = 4.0
# A resume this late (ms) is counted: a client's live follow that misses the next
# attempt's frame gets it only once its idle timer (1 s) makes it join again (as it did
# while recovery removed a tenant's newest consumer past the limit, the one being read).
LATE_MS = 500
# Resumes measured again once N runs wait.
RESUMES_WHILE_WAITING = 50
# Timed executions of each of recovery's statements that read waits.
STATEMENT_REPEATS = 20
STATEMENTS = ("time_out_waits", "queue_stats", "waiting_stats")
RECOVERY_BACKENDS = "postgres (recovery's backends)"
# The figures the headline reads (by these names: report.fill_headline).
RESUME_FIRST_FRAME = "resume → next attempt's run frame"
RECOVERY_CPU_NONE = "recovery CPU, no run waiting"
RECOVERY_CPU_MANY = "recovery CPU, the runs waiting"
FIRST_FRAME_MANY = "submit → first frame of a fresh run p50, the runs waiting"
BATCH_SIZE = RecoverySettings.model_fields["batch_size"].default


@dataclass
class Usage:
    """What the idle stack used over a window: CPU ms per second and memory, by name."""

    cpu_ms_per_s: dict[str, float]
    rss_mib: dict[str, float]
    postgres_private_mib: float | None
    tables_mib: float
    statements_ms: dict[str, float]


async def make_waiting(stack: Stack, n: int) -> tuple[list[str], float]:
    """Submit `n` runs of the runner that asks; return their ids once every one waits,
    and the seconds that took."""
    began = time.monotonic()
    sent = await throughput.submit_many(stack.client, n, WAIT_INPUT, runner=RUNNER)
    if sent.rejected:
        raise RuntimeError(f"submits refused: {sent.rejected}")
    deadline = began + max(120.0, n / 20)
    while True:
        waiting = await stack.db.fetchval(
            "SELECT count(*) FROM runs WHERE run_id = ANY($1::uuid[]) AND status = 'waiting'",
            sent.run_ids,
        )
        if waiting >= n:
            return sent.run_ids, time.monotonic() - began
        if time.monotonic() > deadline:
            raise TimeoutError(f"{n - waiting} of {n} runs not waiting")
        stack.check_alive()
        await asyncio.sleep(0.2)


async def resume_one(stack: Stack, run_id: str) -> tuple[float, float]:
    """Follow a waiting run to its `wait` frame, answer it, and follow it to `done`:
    (resume → reply, resume → the next attempt's first frame) in ms."""
    frames = stack.client.stream(run_id)
    async for frame in frames:
        if frame.type == FrameType.WAIT:
            break
    began = time.perf_counter()
    await stack.client.resume(run_id, {"go": True})
    replied = time.perf_counter()
    first = await anext(frames)
    arrived = time.perf_counter()
    if first.type != FrameType.RUN:
        raise RuntimeError(f"run {run_id}: the resumed attempt began with {first.type}")
    async for frame in frames:
        if frame.type == FrameType.DONE:
            break
    return (replied - began) * 1000, (arrived - began) * 1000


async def resume_latency(stack: Stack, run_ids: list[str]) -> tuple[list[float], list[float]]:
    """Resume each run in turn; (replies, first frames) in ms."""
    replies: list[float] = []
    firsts: list[float] = []
    for run_id in run_ids:
        reply, first = await resume_one(stack, run_id)
        replies.append(reply)
        firsts.append(first)
    return replies, firsts


async def _backends_of(stack: Stack, pid: int) -> list[int]:
    """The Postgres backends serving the connections of process `pid`."""
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []
    pg_port = stack.servers.postgres.port
    ports = [c.laddr.port for c in conns if c.raddr and c.raddr.port == pg_port]
    rows = await stack.db.fetch(
        "SELECT pid FROM pg_stat_activity WHERE client_port = ANY($1::int[])", ports
    )
    return [int(r["pid"]) for r in rows]


async def statement_ms(stack: Stack, name: str, *args: Any) -> float:
    """Median ms of recovery's named statement `name`, run as recovery runs it, each
    time in a transaction rolled back (it changes nothing: no wait is due)."""
    took: list[float] = []
    async with stack.db.acquire() as conn:
        for _ in range(STATEMENT_REPEATS):
            tx = conn.transaction()
            await tx.start()
            try:
                began = time.perf_counter()
                await conn.fetch(QUERIES[name], *args)
                took.append((time.perf_counter() - began) * 1000)
            finally:
                await tx.rollback()
    return round(statistics.median(took), 2)


async def usage(stack: Stack, label: str) -> Usage:
    """CPU and memory of the idle stack over IDLE_WINDOW_S."""
    srv = stack.servers
    pids = {name: proc.pid for name, proc in stack.procs.items()}
    nats_pid, pg_pid = srv.nats.pid, srv.postgres.pid
    assert nats_pid is not None
    assert pg_pid is not None
    clock = CpuClock(
        single={**pids, "nats-server": nats_pid},
        trees={"postgres (all processes)": pg_pid},
        groups={RECOVERY_BACKENDS: await _backends_of(stack, pids["recovery"])},
    )
    stack.sampler.watch("nats-server", nats_pid)
    stack.sampler.begin(f"waits: {label}")
    start = clock.measure_start()
    await asyncio.sleep(IDLE_WINDOW_S)
    cpu = clock.ms_per_second(start)
    rss = stack.sampler.end()
    tables = await stack.db.fetchval(
        "SELECT sum(pg_total_relation_size(t)) FROM unnest($1::regclass[]) AS t",
        ["runs", "run_waits", "run_events"],
    )
    statements = {
        "time_out_waits": await statement_ms(stack, "time_out_waits", BATCH_SIZE, "bench"),
        "queue_stats": await statement_ms(stack, "queue_stats"),
        # Not a tick's: every waiting_gauges_interval_ms.
        "waiting_stats": await statement_ms(stack, "waiting_stats"),
    }
    return Usage(cpu, rss, private_mib(pg_pid), round(tables / 2**20, 1), statements)


def _recovery_cpu(found: Usage) -> float:
    """Recovery's CPU: its process's and its Postgres backends', in ms per second."""
    cpu = found.cpu_ms_per_s
    return round(cpu["recovery"] + cpu[RECOVERY_BACKENDS], 2)


def _side_by_side(results: Results, none: Usage, many: Usage, n: int, made: str) -> None:
    def both(name: str, unit: str, ours: float | None, theirs: float | None, note: str) -> None:
        name = f"{name}: 0 waiting / {n:,} waiting"
        results.add(SCENARIO, name, f"{ours} / {theirs}", unit, note)

    # /proc counts CPU in ticks of 10 ms: over the window, a figure moves in steps of
    # 10 ms / IDLE_WINDOW_S.
    window = f"idle window of {IDLE_WINDOW_S:.0f} s (CPU in 10 ms ticks); {made}"
    for name in none.cpu_ms_per_s:
        both(f"CPU {name}", "ms/s", none.cpu_ms_per_s[name], many.cpu_ms_per_s.get(name), window)
    for name in sorted(set(none.rss_mib) | set(many.rss_mib)):
        ours, theirs = none.rss_mib.get(name), many.rss_mib.get(name)
        both(
            f"peak RSS {name}",
            "MiB",
            None if ours is None else round(ours, 1),
            None if theirs is None else round(theirs, 1),
            window,
        )
    both(
        "Postgres private memory (USS, every process)",
        "MiB",
        none.postgres_private_mib,
        many.postgres_private_mib,
        "shared buffers not counted",
    )
    both(
        "Postgres size of runs, run_waits, run_events (tables and indexes)",
        "MiB",
        none.tables_mib,
        many.tables_mib,
        "",
    )
    for name in STATEMENTS:
        both(
            f"recovery's `{name}` statement, median",
            "ms",
            none.statements_ms[name],
            many.statements_ms[name],
            f"run once per recovery tick; median of {STATEMENT_REPEATS}",
        )


async def fresh_first_frame(stack: Stack) -> dict[str, float | None]:
    found = await latency.run_at_rate(stack, FRESH_RATE, FRESH_SECONDS)
    return percentiles(found.first_frame)


async def measure(stack: Stack, results: Results, resumes: int, waiting: int) -> None:
    """The whole scenario on `stack` (started with RUNNERS registered)."""
    progress(f"{SCENARIO}: idle stack, {resumes} resumes one at a time")
    interval = stack.settings.get(
        "recovery_interval_ms", RecoverySettings.model_fields["recovery_interval_ms"].default
    )
    none = await usage(stack, "0 waiting")
    fresh_none = await fresh_first_frame(stack)
    asked, _ = await make_waiting(stack, resumes)
    replies, firsts = await resume_latency(stack, asked)
    p = results.add_percentiles(SCENARIO, RESUME_FIRST_FRAME, firsts)
    results.add_percentiles(SCENARIO, "resume → reply", replies)
    results.latency_samples["runwire resume → run frame"] = firsts
    late = sum(1 for ms in firsts if ms >= LATE_MS)
    results.add(
        SCENARIO,
        f"resumes whose run frame reached the client {LATE_MS} ms late or more",
        f"{late} of {len(firsts)}",
        "resumes",
        "late: the client heard the frame only when it joined again after its idle wait",
    )
    progress(f"{SCENARIO}: resume → run frame p50 {p['p50']} ms, p99 {p['p99']} ms")

    progress(f"{SCENARIO}: making {waiting:,} waiting runs (submits of {RUNNER})")
    many_ids, took = await make_waiting(stack, waiting)
    made = (
        f"{waiting:,} made through submits of a runner that asks, in {took:.0f} s "
        f"({waiting / took:.0f} runs/s to waiting)"
    )
    results.add(SCENARIO, f"{waiting:,} runs to waiting (submit → wait)", round(took, 1), "s", made)
    progress(f"{SCENARIO}: {made}")
    many = await usage(stack, f"{waiting} waiting")
    fresh_many = await fresh_first_frame(stack)
    _, firsts_many = await resume_latency(stack, many_ids[:RESUMES_WHILE_WAITING])

    _side_by_side(results, none, many, waiting, f"recovery tick every {interval} ms")
    note = f"{FRESH_RATE} runs/s for {FRESH_SECONDS:.0f} s, as scenario 2"
    for label in ("p50", "p99"):
        results.add(
            SCENARIO,
            f"submit → first frame of a fresh run {label}: 0 waiting / {waiting:,} waiting",
            f"{fresh_none[label]} / {fresh_many[label]}",
            "ms",
            note,
        )
    found = percentiles(firsts_many)
    results.add(
        SCENARIO,
        f"resume → next attempt's run frame with {waiting:,} waiting, p50 / p99",
        f"{found['p50']} / {found['p99']}",
        "ms",
        f"{len(firsts_many)} resumes one at a time",
    )
    # Single numbers, under names that do not change with N, for the headline.
    ours = {label: _recovery_cpu(u) for label, u in (("0", none), ("N", many))}
    results.add(SCENARIO, RECOVERY_CPU_NONE, ours["0"], "ms/s", "its process and its backends")
    results.add(SCENARIO, RECOVERY_CPU_MANY, ours["N"], "ms/s", f"{waiting:,} waiting")
    results.add(SCENARIO, FIRST_FRAME_MANY, fresh_many["p50"], "ms", f"{waiting:,} waiting; {note}")
    progress(
        f"{SCENARIO}: recovery CPU {ours['0']} → {ours['N']} ms/s; fresh first frame p50 "
        f"{fresh_none['p50']} → {fresh_many['p50']} ms"
    )


def settings(base: dict[str, Any]) -> dict[str, Any]:
    """The scenario's stack settings: `base` with the waiting runner registered and a
    queue deep enough for every waiting run at once."""
    return {**base, "runners": RUNNERS, "queue_capacity": 200_000}


async def on_own_stack(srv: Servers, results: Results, resumes: int, waiting: int) -> None:
    """The scenario on a stack of its own, with the runner that asks registered."""
    stack = Stack(srv, "waits", settings(BASE_SETTINGS), executors=1)
    try:
        progress(f"{SCENARIO}: starting runwire with the runner that asks")
        await stack.start()
        await throughput.warm_up(stack)
        await measure(stack, results, resumes, waiting)
    finally:
        await stack.close()


def main() -> None:
    """This scenario alone: `python -m bench.waits` (no results files written)."""
    resumes = int(os.environ.get("BENCH_RESUMES", "200"))
    waiting = int(os.environ.get("BENCH_WAITING", "10000"))
    results = Results()
    results.meta = {"mode": "waits alone", "machine": report.machine(), "versions": {}}

    async def go() -> None:
        with servers() as srv:
            await on_own_stack(srv, results, resumes, waiting)

    asyncio.run(go())
    report.fill_headline(results, 0)
    print(report.markdown(results), file=sys.stdout)


if __name__ == "__main__":
    main()
