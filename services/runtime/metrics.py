"""Prometheus metrics of every service, served on `/metrics` when `metrics_port` is set.

runwire's own metrics are named `runwire_*`. FastStream's Prometheus middleware adds its
`faststream_*` metrics of every message a service's FastStream subscribers handle
(commands, health, cancel notices: received, in process, processing time, exceptions),
labelled by service (`app_name`) and by the subscriber's subject pattern (`handler`,
e.g. `rw.{tenant}.cmd.submit`), not the subject itself, which names a tenant or a run.
`runwire_command_duration_seconds{command}` stays as it was (the README and dashboards
quote it); FastStream's names cannot be mapped onto it.

Each service has a registry of its own (not the library's global one, so nothing else
registers into it by accident) holding only the families that service moves, its
FastStream metrics, and the process's CPU and memory: a scrape of the executor's port
shows attempts, never the relay's frames at zero. The metric objects are created outside
any registry and `FAMILIES` places each in its services' registries. They are module
globals, so services running in one process (the in-process test stack) move the same
objects; the HTTP endpoint is started at most once per port.
"""

import logging
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from faststream.message import StreamMessage
from faststream.nats.prometheus.provider import NatsMetricsSettingsProvider
from faststream.prometheus import ConsumeAttrs, PrometheusMiddleware
from nats.aio.msg import Msg
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


class QueueCollector(Collector):
    """Queue depth and oldest waiting age per tenant, as last measured by recovery.

    A snapshot replaced whole on each measure, so a tenant whose queue emptied
    disappears instead of keeping its last value.
    """

    def __init__(self) -> None:
        self._snapshot: list[tuple[str, int, float]] = []

    def update(self, rows: Iterable[tuple[str, int, float]]) -> None:
        self._snapshot = list(rows)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snapshot = self._snapshot
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
        for tenant, count, oldest_s in snapshot:
            depth.add_metric([tenant], count)
            age.add_metric([tenant], oldest_s)
        yield depth
        yield age


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
    "Attempts ended, by outcome (finished, retry, failed, canceled, released, lost) and "
    "error code (none when finished).",
    ["outcome", "code"],
    registry=None,
)
RETRIES = Counter(
    "runwire_retries_total",
    "Attempts that failed and were requeued for another attempt, by error code.",
    ["code"],
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
    "Frames published to clients by the relay (rate() gives frames per second).",
    registry=None,
)
RELAY_LAG = Histogram(
    "runwire_relay_lag_seconds",
    "Seconds from a frame's creation (its `at`) to its publication by the relay.",
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

# The families each service moves. The command server is shared runtime code that the
# submitter (submit, get, cancel, ...) and the relay (join) both run.
FAMILIES: dict[str, tuple[Collector, ...]] = {
    "submitter": (COMMAND_DURATION,),
    "executor": (ATTEMPTS_IN_FLIGHT, ATTEMPT_DURATION, ATTEMPT_OUTCOMES, RETRIES),
    "relay": (FRAMES_RELAYED, RELAY_LAG, COMMAND_DURATION),
    "recovery": (QUEUE, RECOVERIES, INTERRUPTED),
}

# CPU seconds, resident memory, open files: what a service costs, from /proc (Linux only).
PROCESS = ProcessCollector(registry=None)


def _registry(collectors: Iterable[Collector]) -> CollectorRegistry:
    registry = CollectorRegistry()
    for collector in (*collectors, PROCESS):
        registry.register(collector)
    return registry


REGISTRIES: dict[str, CollectorRegistry] = {
    service: _registry(collectors) for service, collectors in FAMILIES.items()
}


class _SubjectPatterns(NatsMetricsSettingsProvider):
    """FastStream's NATS metrics, labelled by subject pattern: a subject's tokens that
    are path parameters of the subscriber (`{tenant}`, `{run_id}`) show as their names,
    so that a label never names a tenant or a run (unbounded series)."""

    def get_consume_attrs_from_message(self, msg: "StreamMessage[Msg]") -> ConsumeAttrs:
        attrs = super().get_consume_attrs_from_message(msg)
        names = {str(value): f"{{{name}}}" for name, value in msg.path.items()}
        tokens = attrs["destination_name"].split(".")
        attrs["destination_name"] = ".".join(names.get(token, token) for token in tokens)
        return attrs


def _patterns(msg: Any) -> _SubjectPatterns | None:
    # Core and JetStream messages; key-value and object-store watches are not measured.
    return _SubjectPatterns() if isinstance(msg, Msg) or msg is None else None


def faststream_metrics(service: str) -> PrometheusMiddleware[Any, Any]:
    """FastStream's Prometheus middleware for a service's broker, in runwire's registry."""
    return PrometheusMiddleware(
        settings_provider_factory=_patterns,
        # A service runwire does not ship (a test's) gets a registry nobody serves.
        registry=REGISTRIES.get(service) or CollectorRegistry(),
        app_name=f"runwire-{service}",
    )


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
