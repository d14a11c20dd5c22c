"""Prometheus metrics of every service, served on `/metrics` when `metrics_port` is set.

runwire's metrics are named `runwire_*`; commands are measured by
`runwire_command_duration_seconds{command}` (docs/observability.md and dashboards quote it).
FastStream's Prometheus middleware is not used: its names cannot be mapped onto these,
and it cost about 120 µs per command, some 12% of the submitter's CPU per submit
(measured per process under a submit load), for figures that duplicate ours.

Each service has a registry of its own (not the library's global one, so nothing else
registers into it by accident) holding only the families that service moves and the
process's CPU and memory: a scrape of the executor's port
shows attempts, never the relay's frames at zero. The metric objects are created outside
any registry and `FAMILIES` places each in its services' registries. They are module
globals, so services running in one process (the in-process test stack) move the same
objects; the HTTP endpoint is started at most once per port.
"""

import gc
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

# Attempts run from milliseconds (scripted) to many minutes (real agents).
ATTEMPT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


@dataclass(frozen=True, slots=True)
class TenantQueue:
    """What a tenant's queue holds, as recovery measures it."""

    tenant: str
    depth: int  # runs waiting for an attempt (queued or recovering)
    oldest_age_s: float | None  # since the oldest of them was submitted
    held: int  # of them, without a job yet: delayed, or behind a session, key or share
    issued: int  # runs holding a job: queued for an executor or running
    share: int  # the jobs its runs may hold at once


class QueueCollector(Collector):
    """Queue depth and oldest waiting age per tenant, its runs held back and its share, as
    last measured by recovery.

    A snapshot replaced whole on each measure, so a tenant whose queue emptied
    disappears instead of keeping its last value.
    """

    def __init__(self) -> None:
        self._queued: list[TenantQueue] = []
        self._waiting: list[tuple[str, int, float]] = []

    def update(self, rows: Iterable[TenantQueue]) -> None:
        """What each tenant's queue holds now."""
        self._queued = list(rows)

    def update_waiting(self, rows: Iterable[tuple[str, int, float]]) -> None:
        """Runs waiting for an answer: (tenant, how many, how long the oldest waited)."""
        self._waiting = list(rows)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        queued, waiting_now = self._queued, self._waiting
        depth = GaugeMetricFamily(
            "runwire_queue_depth",
            "Runs waiting for an attempt (queued or recovering), per tenant.",
            labels=["tenant"],
        )
        age = GaugeMetricFamily(
            "runwire_queue_oldest_age_seconds",
            "Seconds since the oldest run waiting for an attempt was submitted, per tenant.",
            labels=["tenant"],
        )
        waiting = GaugeMetricFamily(
            "runwire_waiting_runs",
            "Runs waiting for an answer, a signal or a timer (no worker held), per tenant.",
            labels=["tenant"],
        )
        waited = GaugeMetricFamily(
            "runwire_waiting_oldest_seconds",
            "Seconds the run that has waited longest for its answer has waited, per tenant.",
            labels=["tenant"],
        )
        held = GaugeMetricFamily(
            "runwire_queue_held_runs",
            "Runs waiting for an attempt without a job yet: delayed, or behind their "
            "session, concurrency key or tenant's share, per tenant.",
            labels=["tenant"],
        )
        jobs = GaugeMetricFamily(
            "runwire_tenant_jobs",
            "Runs holding a job (queued for an executor or running), per tenant.",
            labels=["tenant"],
        )
        share = GaugeMetricFamily(
            "runwire_tenant_share_runs",
            "The jobs a tenant's runs may hold at once (its fair share), per busy tenant.",
            labels=["tenant"],
        )
        for q in queued:
            if q.depth:
                depth.add_metric([q.tenant], q.depth)
                age.add_metric([q.tenant], q.oldest_age_s or 0.0)
                held.add_metric([q.tenant], q.held)
            jobs.add_metric([q.tenant], q.issued)
            share.add_metric([q.tenant], q.share)
        for tenant, waits, oldest_wait_s in waiting_now:
            waiting.add_metric([tenant], waits)
            waited.add_metric([tenant], oldest_wait_s)
        yield depth
        yield age
        yield held
        yield jobs
        yield share
        yield waiting
        yield waited


QUEUE = QueueCollector()

# -- executor ------------------------------------------------------------------
ATTEMPTS_IN_FLIGHT = Gauge(
    "runwire_attempts_in_flight",
    "Attempts running in this executor now.",
    registry=None,
)
ATTEMPT_DURATION = Histogram(
    "runwire_attempt_duration_seconds",
    "Wall time of an attempt, from its start to its outcome.",
    buckets=ATTEMPT_BUCKETS,
    registry=None,
)
ATTEMPT_OUTCOMES = Counter(
    "runwire_attempt_outcomes_total",
    "Attempts ended, by outcome (finished, retry, failed, canceled, released, waiting, "
    "rate_limited, lost) and error code (none when finished).",
    ["outcome", "code"],
    registry=None,
)
# Waits last from no time (a signal kept for them) to days (a person's answer).
WAIT_BUCKETS = (0.01, 0.1, 1, 10, 60, 300, 1800, 3600, 4 * 3600, 86400, 7 * 86400)
WAIT_DURATION = Histogram(
    "runwire_wait_duration_seconds",
    "How long a run's wait lasted, from its start to its answer, signal or timeout, by "
    "kind (interrupt, signal, sleep) and outcome (answered, timed_out); observed once, by "
    "the attempt that goes on after it.",
    ["kind", "outcome"],
    buckets=WAIT_BUCKETS,
    registry=None,
)
RETRIES = Counter(
    "runwire_retries_total",
    "Attempts that failed and were requeued for another attempt, by error code.",
    ["code"],
    registry=None,
)
RATE_LIMITED = Counter(
    "runwire_rate_limited_calls_total",
    "Model calls that found no room under a rate limit (their runs waited), by limit.",
    ["limit"],
    registry=None,
)

# -- recovery ------------------------------------------------------------------
RECOVERIES = Counter(
    "runwire_recoveries_total",
    "Runs whose lease expired and that were put back in the queue by recovery.",
    registry=None,
)
INTERRUPTED = Counter(
    "runwire_interrupted_runs_total",
    "Runs closed as interrupted after too many recoveries without progress.",
    registry=None,
)

# -- relay ---------------------------------------------------------------------
FRAMES_RELAYED = Counter(
    "runwire_frames_relayed_total",
    "Frames the relay archived to Postgres segments (rate() gives frames per second).",
    registry=None,
)
RELAY_LAG = Histogram(
    "runwire_relay_lag_seconds",
    "Seconds from a frame's creation (its `at`) to its segment written by the relay.",
    buckets=LAG_BUCKETS,
    registry=None,
)

# -- commands ------------------------------------------------------------------
COMMAND_DURATION = Histogram(
    "runwire_command_duration_seconds",
    "Time to answer a request/reply command, by command name.",
    ["command"],
    registry=None,
)
COMMANDS_REFUSED = Counter(
    "runwire_commands_refused_total",
    "Commands not served because their reply subject lay outside the tenant's inbox.",
    ["command"],
    registry=None,
)

# -- every service: the garbage collector -------------------------------------------
GC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)
GC_PAUSE = Histogram(
    "runwire_gc_pause_seconds",
    "Time the garbage collector held the service (all its work waits), by generation "
    "(2: a full collection).",
    ["generation"],
    buckets=GC_BUCKETS,
    registry=None,
)
GC_FROZEN = Gauge(
    "runwire_gc_frozen_objects",
    "Objects made at start-up and kept out of every garbage collection since.",
    registry=None,
)


class _CollectionTimer:
    """Times each garbage collection (a `gc.callbacks` entry)."""

    def __init__(self) -> None:
        self._started = 0.0
        self._by_generation = [GC_PAUSE.labels(str(g)) for g in range(3)]

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started:
            self._by_generation[info["generation"]].observe(time.perf_counter() - self._started)
            self._started = 0.0


_timer: _CollectionTimer | None = None


def time_collections() -> None:
    """Measure this process's garbage collections into `runwire_gc_pause_seconds`."""
    global _timer
    if _timer is None:
        _timer = _CollectionTimer()
        gc.callbacks.append(_timer)


def freeze_startup_objects() -> None:
    """Keep what start-up made (modules, models, connections: most of a service's
    objects, alive until it exits) out of every later garbage collection. A full
    collection otherwise walks them all: 55-70 ms in which the service does nothing
    else and every run in flight waits (measured at 200 runs/s: one every few seconds
    in a busy executor, and the first frame's p99 with it)."""
    gc.collect()
    gc.freeze()
    GC_FROZEN.set(gc.get_freeze_count())


# The families each service moves. The command server is shared runtime code that the
# submitter (submit, get, cancel, ...) and the relay (join) both run.
FAMILIES: dict[str, tuple[Collector, ...]] = {
    "submitter": (COMMAND_DURATION, COMMANDS_REFUSED),
    "executor": (
        ATTEMPTS_IN_FLIGHT,
        ATTEMPT_DURATION,
        ATTEMPT_OUTCOMES,
        RETRIES,
        WAIT_DURATION,
        RATE_LIMITED,
    ),
    "relay": (FRAMES_RELAYED, RELAY_LAG, COMMAND_DURATION, COMMANDS_REFUSED),
    "recovery": (QUEUE, RECOVERIES, INTERRUPTED),
}

# CPU seconds, resident memory, open files: what a service costs, from /proc (Linux only).
PROCESS = ProcessCollector(registry=None)


def _registry(collectors: Iterable[Collector]) -> CollectorRegistry:
    registry = CollectorRegistry()
    for collector in (*collectors, PROCESS, GC_PAUSE, GC_FROZEN):
        registry.register(collector)
    return registry


REGISTRIES: dict[str, CollectorRegistry] = {
    service: _registry(collectors) for service, collectors in FAMILIES.items()
}


_served: set[int] = set()
_served_lock = threading.Lock()


def serve_metrics(service: str, port: int, host: str = "0.0.0.0") -> None:
    """Serve `service`'s metrics on `host:port`/metrics in a daemon thread (once per port;
    port 0 serves nothing)."""
    if service not in REGISTRIES:
        raise ValueError(f"no metrics for service {service!r}; known: {', '.join(REGISTRIES)}")
    if port == 0:
        return
    with _served_lock:
        if port in _served:
            return
        start_http_server(port, addr=host, registry=REGISTRIES[service])
        _served.add(port)
    log.info("metrics served on %s:%d", host, port)
