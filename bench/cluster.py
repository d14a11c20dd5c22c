"""Scenario 11, sizing on a cluster: the throughput workload and one level of many
streams on a JetStream cluster of three servers (every stream at three replicas), with
1, 2 and 4 executors and 2 relays, each service process connected first to a server of
its own (as `make up CLUSTER=3` runs them).

Each figure is set beside the same workload on the bench's single server, measured in
the same run: what the three replicas cost, and what each added executor buys.
"""

from __future__ import annotations

import asyncio
from typing import Any

from bench import many_streams, throughput
from bench.many_streams import Level
from bench.results import Results
from bench.stack import Servers, Stack, progress
from runwire.infra.embedded import EmbeddedNatsCluster

SERVERS = 3
EXECUTORS = (1, 2, 4)
RELAYS = 2
SCENARIO = "11 sizing on an R3 cluster"


async def measure(
    srv: Servers,
    results: Results,
    settings: dict[str, Any],
    runs: int,
    streams: int,
    single: dict[int, Level],
) -> None:
    """Throughput with `runs` runs and `streams` streams at once, per executor count."""
    cluster = EmbeddedNatsCluster(srv.folder / "cluster", SERVERS)
    progress(f"{SCENARIO}: starting {SERVERS} nats-servers")
    await asyncio.to_thread(cluster.start)
    single_rate = results.throughput.get("runwire (1 executor)")
    try:
        for executors in EXECUTORS:
            label = (
                f"R3 cluster, {executors} executor{'s' if executors > 1 else ''}, {RELAYS} relays"
            )
            stack = Stack(
                srv,
                f"cluster{executors}",
                {**settings, "stream_replicas": SERVERS, "max_in_flight": max(64, streams)},
                executors=executors,
                relays=RELAYS,
                cluster_urls=[node.url for node in cluster.nodes],
            )
            try:
                progress(f"{SCENARIO}: {label}")
                await stack.start()
                await throughput.warm_up(stack)
                rate = await throughput.measure(stack, results, label, runs)
                found = await many_streams.measure_runwire(
                    stack, results, [streams], system=f"runwire, {label}"
                )
            finally:
                await stack.close()
            level = found[streams]
            results.add(
                SCENARIO,
                f"{executors} executors: runs finished per second",
                round(rate, 1),
                "runs/s",
                _against(rate, single_rate, "1 executor on one server"),
            )
            results.add(
                SCENARIO,
                f"{executors} executors: {streams} streams delivered",
                round(level.delivered),
                "tokens/s",
                _against(level.delivered, _delivered(single, streams), "on one server"),
            )
            results.add(
                SCENARIO,
                f"{executors} executors: {streams} streams lag p99",
                level.lag.get("p99"),
                "ms",
                f"exact {level.exact} of {streams}",
            )
    finally:
        await asyncio.to_thread(cluster.stop)


def _delivered(levels: dict[int, Level], n: int) -> float | None:
    level = levels.get(n)
    return level.delivered if level is not None and not level.error else None


def _against(value: float, base: float | None, what: str) -> str:
    if not base:
        return f"({what}: not measured)"
    return f"{value / base:.2f}x {what} ({base:.0f})"
