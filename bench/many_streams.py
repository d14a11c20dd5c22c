"""Scenario 10: many streams at once, through runwire and through Redis Streams.

N runs each stream 100 tokens, one every 20 ms (N x 50 tokens/s offered). Their clients
are `READERS` processes of their own (`bench.stream_readers`), each starting its share
of the runs together and following every one to its end. runwire runs as in production,
every service a process, every frame kept in Postgres; the peer is Redis Streams (XADD
per token by `bench.redis_producer`, XREAD with resume by id, no persistence), the
relay that LangGraph Platform and Vercel's `resumable-stream` use. Each level runs on
runwire and then at once on the peer, so that a level's two figures are side by side.

Per level of N: the tokens per second delivered (each stream's own rate, summed: N x 50
when every stream keeps its pace), how many streamed at once, the lag of every token
(receipt minus the time its producer stamped on it), the first token's latency (start
of the run → its first token), whether every transcript was exact, and the services'
peak memory. A level is held when it delivers at least 95% of the offered rate, with a
lag p99 under 100 ms, a first token p99 under 50 ms, every transcript exact and every
service under 200 MiB; the table gives the largest level held. Before the levels, one
of 25 runs on the stack just started (`runwire, just started`): what the first users
after a deploy or a restart get.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from bench.cpu import CpuClock
from bench.results import Results, percentiles
from bench.stack import ROOT, Servers, Stack, progress
from bench.throughput import machine_clock

TOKENS = 100
DELAY_MS = 20
READERS = 2
# What a level must reach to be held.
MIN_DELIVERED = 0.95
MAX_LAG_P99_MS = 100.0
MAX_FIRST_P99_MS = 50.0
MAX_RSS_MIB = 200.0
# How long runwire's executor holds a text delta for the next ones to join its frame
# (RUNWIRE_COALESCE_MS): at a token every 20 ms, two or three tokens a frame, for a
# token lag of at most this much more.
COALESCE_MS = 40
START_DELAY_S = 2.0  # reader processes start and connect meanwhile
LEVEL_TIMEOUT_S = 150.0
# The level run on a stack that has only just started.
FIRST_BURST = 25


@dataclass
class Level:
    """One level of N streams, as measured."""

    runs: int
    offered: float = 0.0
    delivered: float = 0.0
    at_once: int = 0
    lag: dict[str, float | None] = field(default_factory=dict)
    first: dict[str, float | None] = field(default_factory=dict)
    exact: int = 0
    finished: int = 0
    retried: int = 0
    rss: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    # Tokens the readers received, and the machine CPU per token (the system's
    # processes over the level; the readers left out).
    received: int = 0
    cpu_us_per_token: float | None = None

    @property
    def held(self) -> bool:
        lag, first = self.lag.get("p99"), self.first.get("p99")
        return (
            self.error is None
            and self.exact == self.runs
            and self.delivered >= MIN_DELIVERED * self.offered
            and lag is not None
            and lag < MAX_LAG_P99_MS
            and first is not None
            and first < MAX_FIRST_P99_MS
            and all(mib < MAX_RSS_MIB for mib in self.rss.values())
        )


def _peak_at_once(spans: list[tuple[float, float]]) -> int:
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    now = peak = 0
    for _, step in edges:
        now += step
        peak = max(peak, now)
    return peak


async def _readers(base: dict[str, Any], runs: int) -> Level:
    """Run one level: READERS processes share the runs; their tallies make the level."""
    level = Level(runs)
    start_at = time.time() + START_DELAY_S
    shares = [list(range(i, runs, READERS)) for i in range(READERS)]
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.stream_readers",
            json.dumps({**base, "runs": share, "start_at": start_at, "timeout_s": LEVEL_TIMEOUT_S}),
            cwd=ROOT,
            stdout=subprocess.PIPE,
        )
        for share in shares
        if share
    ]
    outs = await asyncio.gather(*(p.communicate() for p in procs))
    tallies = [json.loads(out.decode() or "{}") for out, _ in outs]
    entries = [e for t in tallies for e in t.get("runs", {}).values()]
    lags = [lag for t in tallies for lag in t.get("lags_ms", [])]
    errors = [t.get("error") for t in tallies if t.get("error")] or [
        f"reader exited {p.returncode}" for p in procs if p.returncode
    ]
    level.error = errors[0] if errors else None
    streamed = [e for e in entries if e.get("first") is not None]
    if entries:
        # Offered: every token of every run, from the first run's start to when the last
        # run, started when it was, would end at its pace. Delivered: every token
        # received, over the first run's start to the last token received. The same
        # when every stream keeps its pace, whenever its run was started.
        first_start = min(e["started"] for e in entries)
        last_start = max(e["started"] for e in entries)
        level.offered = runs * TOKENS / (last_start - first_start + TOKENS * DELAY_MS / 1000)
        if streamed:
            last_token = max(e["last"] for e in streamed)
            level.delivered = len(lags) / max(1e-6, last_token - first_start)
    level.at_once = _peak_at_once([(e["first"], e["last"]) for e in streamed])
    level.lag = percentiles(lags)
    level.received = len(lags)
    level.first = percentiles([(e["first"] - e["started"]) * 1000 for e in streamed])
    level.exact = sum(1 for e in entries if e.get("exact"))
    level.retried = sum(1 for e in entries if (e.get("attempts") or 1) > 1)
    level.finished = sum(1 for e in entries if e.get("status") == "finished")
    return level


def _record(results: Results, system: str, level: Level) -> None:
    scenario = f"10 many streams ({system})"
    n = level.runs
    results.add(
        scenario,
        f"{n} streams: offered",
        round(level.offered),
        "tokens/s",
        f"{n * 1000 // DELAY_MS} if every run started at once",
    )
    results.add(
        scenario,
        f"{n} streams: delivered",
        round(level.delivered),
        "tokens/s",
        f"{level.delivered / max(1.0, level.offered):.0%} of offered",
    )
    results.add(scenario, f"{n} streams: streaming at once (peak)", level.at_once, "runs", "")
    results.add(
        scenario, f"{n} streams: lag p99", level.lag.get("p99"), "ms", "token stamped → client"
    )
    results.add(
        scenario,
        f"{n} streams: first token p99",
        level.first.get("p99"),
        "ms",
        "start → first token",
    )
    results.add(scenario, f"{n} streams: exact transcripts", f"{level.exact} of {n}", "runs")
    results.add(
        scenario,
        f"{n} streams: machine CPU per token",
        level.cpu_us_per_token,
        "µs/token",
        "the system's processes over the level, per token received (readers left out)",
    )
    results.add(
        scenario,
        f"{n} streams: finished",
        f"{level.finished} of {n}",
        "runs",
        f"{level.retried} with a second attempt" if level.retried else "",
    )
    if level.rss:
        name, mib = max(level.rss.items(), key=lambda kv: kv[1])
        results.add(scenario, f"{n} streams: largest peak RSS", round(mib, 1), "MiB", name)
    results.add(
        scenario,
        f"{n} streams: held",
        "yes" if level.held else "no",
        "",
        level.error or "",
    )


async def _level(results: Results, system: str, n: int, run_level: Any) -> Level:
    """One level of one system: run, record, report."""
    progress(f"10 many streams ({system}): {n} runs x {TOKENS} tokens every {DELAY_MS} ms")
    try:
        level: Level = await run_level(n)
    except Exception as exc:  # noqa: BLE001 - a failed level is a line of the table
        level = Level(n, error=f"{type(exc).__name__}: {exc}"[:300])
    _record(results, system, level)
    progress(
        f"10 many streams ({system}): {n} runs: {level.delivered:.0f} of "
        f"{level.offered:.0f} tokens/s, lag p99 {level.lag.get('p99')} ms, first token "
        f"p99 {level.first.get('p99')} ms, exact {level.exact}/{n}, held {level.held}"
    )
    await asyncio.sleep(1.0)
    return level


def _most_held(results: Results, system: str, found: dict[int, Level]) -> None:
    held = [n for n, level in found.items() if level.held]
    results.add(
        f"10 many streams ({system})",
        "most streams held within the bounds",
        max(held) if held else 0,
        "runs",
        f"levels tried: {', '.join(str(n) for n in found)}",
    )


async def _ladder(
    results: Results, system: str, levels: list[int], run_level: Any
) -> dict[int, Level]:
    """Each level in turn."""
    found = {n: await _level(results, system, n, run_level) for n in levels}
    _most_held(results, system, found)
    return found


def _runwire_levels(stack: Stack) -> Any:
    """What runs one level of N streams through `stack`."""
    base = {
        "system": "runwire",
        "nats_url": stack.nats_url,
        "prefix": stack.prefix,
        "tokens": TOKENS,
        "delay_ms": DELAY_MS,
    }

    async def run_level(n: int) -> Level:
        stack.sampler.begin(f"many streams {n}")
        clock = machine_clock(stack)
        before = clock.read()
        try:
            level = await _readers(base, n)
        finally:
            peaks = stack.sampler.end()
        level.rss = peaks
        level.cpu_us_per_token = _per_token(clock.read(), before, level)
        return level

    return run_level


def _per_token(after: dict[str, float], before: dict[str, float], level: Level) -> float | None:
    """CPU µs of the measured processes over the level, per token its readers received."""
    if not level.received:
        return None
    used = sum(after[name] - before.get(name, 0.0) for name in after)
    return round(used * 1e6 / level.received, 1)


async def measure_runwire(
    stack: Stack, results: Results, levels: list[int], system: str = "runwire"
) -> dict[int, Level]:
    return await _ladder(results, system, levels, _runwire_levels(stack))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def _redis_server(servers: Servers) -> Any:
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed (Debian's redis-server package)")
    port = _free_port()
    folder = servers.folder / "redis"
    folder.mkdir(exist_ok=True)
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(folder),
            "--maxclients",
            "20000",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0", proc.pid
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)


@contextlib.asynccontextmanager
async def _redis_levels(servers: Servers) -> AsyncIterator[Any]:
    """A Redis server for the peer, and what runs one level of N streams through it."""
    try:
        import redis  # noqa: F401 - the bench's venv
    except ImportError as exc:
        raise RuntimeError("the redis Python client is not installed") from exc
    from bench.memory import RssSampler

    with _redis_server(servers) as (url, pid):
        sampler = RssSampler()
        sampler.watch("redis-server", pid)
        sampler.start()

        async def run_level(n: int) -> Level:
            namespace = f"l{n}"
            spec = {
                "redis_url": url,
                "namespace": namespace,
                "tokens": TOKENS,
                "delay_ms": DELAY_MS,
            }
            producer = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "bench.redis_producer",
                json.dumps({**spec, "max_runs": n}),
                cwd=ROOT,
                stdout=subprocess.PIPE,
            )
            try:
                assert producer.stdout is not None
                await asyncio.wait_for(producer.stdout.readline(), 30)
                sampler.watch("redis producer", producer.pid)
                sampler.begin(f"redis {n}")
                clock = CpuClock(single={"redis-server": pid, "redis producer": producer.pid})
                before = clock.read()
                try:
                    level = await _readers({"system": "redis", **spec}, n)
                finally:
                    peaks = sampler.end()
                level.rss = peaks
                level.cpu_us_per_token = _per_token(clock.read(), before, level)
                return level
            finally:
                with contextlib.suppress(ProcessLookupError):
                    producer.kill()
                await producer.wait()

        try:
            yield run_level
        finally:
            sampler.stop()


async def measure_first_burst(stack: Stack, results: Results, runs: int = FIRST_BURST) -> Level:
    """One level on a stack that has only just started (each reader process follows one
    run first, as at every level): the first burst of users after a deploy or a restart,
    which waits for whatever a service does on its first work rather than at its start."""
    return await _level(results, "runwire, just started", runs, _runwire_levels(stack))


# The system name of the level run with one frame a token (no two deltas joined).
ONE_FRAME_A_TOKEN = "runwire, one frame a token"


async def measure_one_frame_a_token(stack: Stack, results: Results, runs: int) -> Level:
    """One level on a stack whose executor joins no deltas (`RUNWIRE_COALESCE_MS=0`,
    `RUNWIRE_COALESCE_TEXT=false`): what a token costs when every token is a frame."""
    return await _level(results, ONE_FRAME_A_TOKEN, runs, _runwire_levels(stack))


async def measure_side_by_side(
    stack: Stack, servers: Servers, results: Results, levels: list[int]
) -> tuple[dict[int, Level], dict[int, Level]]:
    """Each level through runwire, then at once through the Redis Streams peer: the two
    figures of a level are measured seconds apart, whatever the shared machine does over
    the rest of the bench (measured one system after the other, the ratios moved with
    it). The idle one stays up meanwhile, as in the throughput rounds."""
    ours: dict[int, Level] = {}
    theirs: dict[int, Level] = {}
    async with _redis_levels(servers) as redis_level:
        runwire_level = _runwire_levels(stack)
        for n in levels:
            ours[n] = await _level(results, "runwire", n, runwire_level)
            theirs[n] = await _level(results, "redis streams", n, redis_level)
    _most_held(results, "runwire", ours)
    _most_held(results, "redis streams", theirs)
    return ours, theirs


def add_comparison(results: Results, ours: dict[int, Level], theirs: dict[int, Level]) -> None:
    """runwire's delivered tokens/s over the Redis relay's, at each level both ran."""
    for n in sorted(set(ours) & set(theirs)):
        a, b = ours[n].delivered, theirs[n].delivered
        if a and b:
            results.add(
                "10 many streams (ratios)",
                f"runwire / redis streams delivered tokens/s, {n} streams",
                round(a / b, 2),
                "ratio",
                "above 1: runwire delivers more",
            )
