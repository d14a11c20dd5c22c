"""`python -m bench` (`make bench`): every scenario of issue 7, then the report.

Quick by default (about 7 minutes on 2 cores); `BENCH_FULL=1` runs larger N. Figures
are printed, never asserted: a scenario that fails is recorded as failed and the
bench goes on.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from bench import (
    cluster,
    flood,
    latency,
    many_streams,
    overload,
    peers,
    recovery,
    rejoin,
    report,
    sse,
    streaming,
    throughput,
    waits,
    workflows,
)
from bench.results import Results
from bench.stack import BASE_SETTINGS, CONCURRENCY, Servers, Stack, progress, servers
from runwire.runtime.settings import RecoverySettings

# Beyond recovery's presence_settle_ms, for its process to start and tick once.
SETTLE_MARGIN_S = 3.0


@dataclass(frozen=True)
class Sizes:
    """How much work each scenario does."""

    mode: str
    runs: int
    rates: tuple[int, ...]
    rate_seconds: float
    stream_short: int
    stream_long: int
    rejoin_frames: int
    recovery_runs: int
    overload_runs: int
    overload_queue: int
    workflow_runs: int
    stream_levels: tuple[int, ...]
    # Streams at once in the sizing scenario on the cluster (one of `stream_levels`).
    cluster_streams: int
    # Rounds of the side-by-side throughput (each system once per round).
    throughput_rounds: int = 3
    # Scenario 11: resumes timed one at a time, and the runs made to wait at once.
    wait_resumes: int = 200
    waiting_runs: int = 10_000
    # Scenario 12: the runs one tenant floods the queue with.
    flood_runs: int = 2_000


QUICK = Sizes(
    "quick",
    2_000,
    (50, 200),
    6.0,
    5_000,
    100_000,
    10_000,
    8,
    300,
    50,
    20,
    (10, 25, 50, 100, 250, 500, 1000),
    500,
)
FULL = Sizes(
    "full",
    20_000,
    (50, 200),
    20.0,
    100_000,
    1_000_000,
    10_000,
    16,
    2_000,
    200,
    100,
    (10, 25, 50, 100, 250, 500, 1000, 2000),
    1000,
    wait_resumes=1_000,
    waiting_runs=100_000,
    flood_runs=5_000,
)


async def guarded(results: Results, scenario: str, step: Callable[[], Awaitable[Any]]) -> None:
    """Run one scenario; a failure becomes a line of the table, not the end of the bench."""
    try:
        await step()
    except Exception as exc:  # noqa: BLE001 - recorded in the table: the bench goes on
        traceback.print_exc(file=sys.stderr)
        results.add(scenario, "status", f"FAILED: {type(exc).__name__}: {exc}"[:400], "")
        progress(f"{scenario} failed: {exc!r}")


async def main_stack(srv: Servers, results: Results, sizes: Sizes) -> None:
    stack = Stack(srv, "main", dict(BASE_SETTINGS), executors=1)
    try:
        progress("starting runwire (submitter, relay, recovery, 1 executor) as processes")
        await stack.start()
        await throughput.warm_up(stack)
        await guarded(
            results,
            "2 latency (runwire)",
            lambda: latency.measure(stack, results, list(sizes.rates), sizes.rate_seconds),
        )
        await guarded(
            results,
            "3 streaming",
            lambda: streaming.measure_coalesced(stack, results, sizes.stream_long),
        )
        await guarded(
            results,
            "8 workflows",
            lambda: workflows.measure(stack, results, sizes.workflow_runs),
        )
        # What counts frames, with one frame per text delta.
        progress("restarting the executor with RUNWIRE_COALESCE_TEXT=false")
        await stack.restart_service("executor-1", coalesce_text="false")
        await guarded(
            results,
            "3 streaming",
            lambda: streaming.measure_per_delta(
                stack, results, sizes.stream_long, sizes.stream_short
            ),
        )
        await guarded(
            results, "4 re-join", lambda: rejoin.measure(stack, results, sizes.rejoin_frames)
        )
        await guarded(
            results,
            "9 SSE through the gateway",
            lambda: sse.measure(stack, results, srv.folder),
        )
    finally:
        await stack.close()


async def side_by_side(srv: Servers, results: Results, sizes: Sizes) -> None:
    """Scenarios 1 and 8: runwire with one executor and with two, DBOS and pgqueuer run
    the same burst one after the other, round after round, each system started and warm
    and the others idle; each one's figure is the median of its rounds. (Measured at
    different moments of the bench, the figures moved with whatever the machine and
    Postgres were doing then, more than the systems differ.)"""
    stacks = {
        "1 executor": Stack(srv, "one", dict(BASE_SETTINGS), executors=1),
        "2 executors": Stack(srv, "two", dict(BASE_SETTINGS), executors=2),
    }
    others = peers.both(srv, CONCURRENCY)
    started: list[peers.Peer] = []
    # Each system's rates, by (its name in results.throughput, its row of the table).
    rates: dict[tuple[str, str, str], list[float]] = {}
    try:
        for label, stack in stacks.items():
            progress(f"starting runwire with {label} as processes")
            await stack.start()
            await throughput.warm_up(stack)
        for peer in others:
            progress(f"8 peer {peer.name}: starting its worker (concurrency {CONCURRENCY})")
            try:
                await peer.start()
                started.append(peer)
            except Exception as exc:  # noqa: BLE001 - recorded in the table
                peers.not_measured(results, peer, exc)
        for round_no in range(1, sizes.throughput_rounds + 1):
            for label, stack in stacks.items():
                rate = await throughput.measure(
                    stack, results, label, sizes.runs, round_no=round_no
                )
                row = (f"1 throughput ({label})", "runs finished per second")
                rates.setdefault((f"runwire ({label})", *row), []).append(rate)
            for peer in list(started):
                try:
                    rate = await peers.measure_throughput(peer, results, sizes.runs, round_no)
                except Exception as exc:  # noqa: BLE001 - recorded in the table
                    peers.not_measured(results, peer, exc)
                    started.remove(peer)
                    continue
                row = (f"8 peer {peer.name}", "jobs done per second")
                rates.setdefault((peer.name, *row), []).append(rate)
    finally:
        for stack in stacks.values():
            await stack.close()
        for peer in others:
            await peer.stop()
    for (name, scenario, what), found in rates.items():
        median = round(statistics.median(found), 1)
        results.throughput[name] = median
        unit = f"{what.split()[0]}/s"
        results.add(scenario, what, median, unit, f"median of {len(found)} rounds")


async def streams(
    srv: Servers, results: Results, sizes: Sizes, ours: dict[int, many_streams.Level]
) -> None:
    """Scenario 10, runwire (a stack of its own, with room for every stream at once) and
    the Redis Streams peer level by level; runwire's levels are left in `ours`."""
    most = max(*sizes.stream_levels, report.CPU_LEVEL)
    # Text deltas held up to this long join one frame (off in the latency scenarios).
    hold = many_streams.COALESCE_MS
    settings = {**BASE_SETTINGS, "max_in_flight": most, "coalesce_ms": hold}
    stack = Stack(srv, "streams", settings, executors=1)
    results.add(
        "10 many streams",
        "runwire's text deltas held to join a frame",
        hold,
        "ms",
        "RUNWIRE_COALESCE_MS; 0 (the default) in every other scenario",
    )
    try:
        progress(f"starting runwire for many streams at once (RUNWIRE_COALESCE_MS={hold})")
        await stack.start()
        await many_streams.measure_first_burst(stack, results)
        await throughput.warm_up(stack)
        found, theirs = await many_streams.measure_side_by_side(
            stack, srv, results, list(sizes.stream_levels)
        )
        ours.update(found)
        # The headline CPU per token is uncoalesced: the same stack, every token a frame.
        progress("restarting the executor with one frame a token (no deltas joined)")
        await stack.restart_service("executor-1", coalesce_ms=0, coalesce_text="false")
        await many_streams.measure_one_frame_a_token(stack, results, report.CPU_LEVEL)
    finally:
        await stack.close()
    many_streams.add_comparison(results, ours, theirs)


async def faults(srv: Servers, results: Results, sizes: Sizes) -> None:
    settings = {
        **BASE_SETTINGS,
        "max_in_flight": sizes.recovery_runs,
        "queue_capacity": sizes.overload_queue,
        "lease_ttl_ms": 5_000,
        "heartbeat_ms": 1_000,
    }
    stack = Stack(srv, "faults", settings, executors=2)
    try:
        progress("starting runwire with 2 executors, short leases, a small queue")
        started = time.monotonic()
        await stack.start()
        await throughput.warm_up(stack, runs=4)
        # Overload first: after the kill, the dead executor's unacked jobs hold slots of
        # the consumer's max_ack_pending until their ack_wait runs out.
        await guarded(
            results, "7 overload", lambda: overload.measure(stack, results, sizes.overload_runs)
        )
        # Recovery believes executors' presence locks once its own lock session has lived
        # presence_settle_ms (as it has, in a stack that runs for more than seconds); its
        # session opens at its first tick, a moment after its process started.
        settle_s = RecoverySettings.model_fields["presence_settle_ms"].default / 1000
        await asyncio.sleep(max(0.0, started + settle_s + SETTLE_MARGIN_S - time.monotonic()))
        await guarded(
            results, "5 recovery", lambda: recovery.measure(stack, results, sizes.recovery_runs)
        )
    finally:
        await stack.close()


async def run(sizes: Sizes) -> Results:
    results = Results()
    results.meta = {
        "mode": sizes.mode,
        "machine": report.machine(),
        "versions": report.versions(),
        "setup": (
            "bench-started nats-server and durable Postgres (fsync on) on loopback; runwire "
            f"services as separate processes, max_in_flight {CONCURRENCY}, INFO JSON logs to "
            "files; one client process with up to 256 requests outstanding; peers: one worker "
            f"process each with concurrency {CONCURRENCY} (DBOS queue polling "
            f"{peers.DBOS_POLL_S * 1000:.0f} ms instead of its 1 s default; pgqueuer batch "
            "10, LISTEN/NOTIFY), a database each on the same Postgres"
        ),
    }
    start = time.monotonic()
    with servers() as srv:
        progress(f"servers up: {srv.nats_url}, {srv.admin_url} ({sizes.mode} mode)")
        await guarded(results, "1 throughput", lambda: side_by_side(srv, results, sizes))
        await guarded(results, "runwire (1 executor)", lambda: main_stack(srv, results, sizes))
        await guarded(results, "5/7 faults", lambda: faults(srv, results, sizes))
        await guarded(
            results,
            waits.SCENARIO,
            lambda: waits.on_own_stack(srv, results, sizes.wait_resumes, sizes.waiting_runs),
        )
        await guarded(
            results, flood.SCENARIO, lambda: flood.measure(srv, results, sizes.flood_runs)
        )
        levels: dict[int, many_streams.Level] = {}
        await guarded(results, "10 many streams", lambda: streams(srv, results, sizes, levels))
        await guarded(
            results,
            cluster.SCENARIO,
            lambda: cluster.measure(
                srv, results, BASE_SETTINGS, sizes.runs, sizes.cluster_streams, levels
            ),
        )
        await peers.measure_latency(
            srv,
            results,
            concurrency=CONCURRENCY,
            rates=list(sizes.rates),
            seconds=sizes.rate_seconds,
            versions=results.meta["versions"],
        )
    report.add_ratios(results, list(sizes.rates))
    report.fill_headline(results, sizes.stream_long)
    results.meta["duration_s"] = round(time.monotonic() - start, 1)
    return results


def main() -> None:
    full = os.environ.get("BENCH_FULL", "").strip() not in ("", "0", "false", "no")
    results = asyncio.run(run(FULL if full else QUICK))
    text = report.write(results)
    if full:  # kept apart too, so that a later quick run does not replace it
        report.write(results, "full")
    print(text)
    written = "latest and full" if full else "latest"
    took = results.meta["duration_s"]
    progress(f"done in {took} s; wrote bench/results/{written}.{{md,json,png}}")


if __name__ == "__main__":
    main()
