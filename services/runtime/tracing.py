"""Traces: one OpenTelemetry trace per run, across the four services.

The submitter starts a run's trace (or continues the caller's, from the W3C
`traceparent` header of the submit request) and stores the trace context with the run.
Every later span of the run descends from it, whichever process and attempt makes it:
jobs and frames carry a `traceparent` header (the same header FastStream's telemetry
middleware reads and writes), and a job that recovery publishes gets it from Postgres.

The exporter follows the standard environment variables: `OTEL_TRACES_EXPORTER`
(`otlp`, `console`, `none`, or a comma-separated list; by default `otlp` when
`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set, `none`
otherwise), the `OTEL_EXPORTER_OTLP_*` settings (HTTP/protobuf), `OTEL_SERVICE_NAME`,
`OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`, `OTEL_BSP_*` and
`OTEL_SDK_DISABLED`. Without an exporter no span is recorded (and none costs anything):
a caller's trace context is still carried through to jobs, frames and events, and log
lines carry the caller's trace id.
"""

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
)
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from runwire.contracts.headers import TRACEPARENT
from runwire.runtime import package_version

log = logging.getLogger(__name__)

EXPORTERS = ("otlp", "console", "none")
OTLP_PROTOCOL = "http/protobuf"
SHUTDOWN_WAIT_S = 2.0

tracer = trace.get_tracer("runwire")
# Always W3C trace context, whatever OTEL_PROPAGATORS says: it is what runwire stores
# with a run and what FastStream clients send.
_w3c = TraceContextTextMapPropagator()


class TracingConfigError(ValueError):
    """The OTEL_* environment asks for something runwire cannot do."""


def _on(value: str | None) -> bool:
    return (value or "").strip().lower() == "true"


def exporters_from_env(env: Mapping[str, str]) -> list[str]:
    """The span exporters the environment asks for (empty: spans are not exported)."""
    raw = env.get("OTEL_TRACES_EXPORTER")
    if raw is None or not raw.strip():
        endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        return ["otlp"] if endpoint else []
    names = [name.strip().lower() for name in raw.split(",") if name.strip()]
    unknown = [name for name in names if name not in EXPORTERS]
    if unknown:
        raise TracingConfigError(
            f"OTEL_TRACES_EXPORTER={raw!r}: unknown exporter {unknown[0]!r}; "
            f"runwire knows {', '.join(EXPORTERS)}"
        )
    if "otlp" in names:
        protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get(
            "OTEL_EXPORTER_OTLP_PROTOCOL", OTLP_PROTOCOL
        )
        if protocol != OTLP_PROTOCOL:
            raise TracingConfigError(
                f"OTLP protocol {protocol!r} is not available; runwire exports "
                f"{OTLP_PROTOCOL} (a collector's port 4318)"
            )
    return [name for name in dict.fromkeys(names) if name != "none"]


def setup(service: str, env: Mapping[str, str] | None = None) -> TracerProvider | None:
    """Install the process's tracer provider from the OTEL_* environment.

    Returns it (to be shut down at exit, which exports what is still buffered), or None
    when spans are not exported (no exporter, or `OTEL_SDK_DISABLED=true`). Raises
    TracingConfigError for an unusable setting.
    """
    env = os.environ if env is None else env
    if _on(env.get("OTEL_SDK_DISABLED")):
        return None
    names = exporters_from_env(env)
    if not names:
        return None
    attributes: dict[str, Any] = {
        "service.version": package_version(),
        "service.namespace": "runwire",
    }
    if not env.get("OTEL_SERVICE_NAME"):
        attributes["service.name"] = f"runwire-{service}"
    # Shut down by `shutdown` below, within a bound, not by the SDK's own exit hook.
    provider = TracerProvider(resource=Resource.create(attributes), shutdown_on_exit=False)
    for name in names:
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        elif name == "console":
            provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    trace.set_tracer_provider(provider)
    log.info("traces exported to %s", ", ".join(names))
    return provider


def shutdown(provider: TracerProvider | None, wait_s: float = SHUTDOWN_WAIT_S) -> None:
    """Export the spans still buffered, then stop; give up after `wait_s` seconds, so
    that a collector that does not answer never holds a stopping service past its
    drain (the exporter's retries would take tens of seconds)."""
    if provider is None:
        return
    stopping = threading.Thread(target=provider.shutdown, name="trace-shutdown", daemon=True)
    stopping.start()
    stopping.join(wait_s)
    if stopping.is_alive():
        log.warning("spans still buffered were not exported: the collector did not answer")


# -- carrying a run's trace -------------------------------------------------------


def context_of(traceparent: str | None) -> Context | None:
    """The trace context a `traceparent` value names (None: start a new trace)."""
    if not traceparent:
        return None
    return _w3c.extract({TRACEPARENT: traceparent})


def recording() -> bool:
    """Whether this process records spans (a tracer provider is installed: traces are
    exported, or a test collects them)."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def context_from_headers(headers: Mapping[str, str] | None) -> Context | None:
    """The trace context of a NATS message, from its `traceparent` header."""
    return context_of((headers or {}).get(TRACEPARENT))


def current_traceparent() -> str | None:
    """The `traceparent` of the current span, when there is one to carry."""
    carrier: dict[str, str] = {}
    _w3c.inject(carrier)
    return carrier.get(TRACEPARENT)


def current_ids() -> tuple[str, str] | None:
    """(trace id, span id) of the current span in hex, for log lines."""
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


def run_attributes(
    run_id: str, tenant: str, *, attempt: int | None = None, generation: int | None = None
) -> dict[str, Any]:
    """The attributes every span of a run carries."""
    attributes: dict[str, Any] = {"run_id": run_id, "tenant": tenant}
    if attempt is not None:
        attributes["attempt"] = attempt
    if generation is not None:
        attributes["generation"] = generation
    return attributes


@contextlib.contextmanager
def span(
    name: str,
    parent: Context | None = None,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: dict[str, Any] | None = None,
) -> Iterator[Span]:
    """A span that is current inside the block; an exception marks it failed."""
    with tracer.start_as_current_span(
        name, context=parent, kind=kind, attributes=attributes
    ) as current:
        yield current


def failed(current: Span, message: str) -> None:
    """Mark a span as failed with a short description."""
    current.set_status(Status(StatusCode.ERROR, message))


def end_with_task(current: Span, task: "asyncio.Task[Any]") -> None:
    """End `current` when `task` ends, recording how it ended (a done callback)."""

    def done(finished: "asyncio.Task[Any]") -> None:
        if finished.cancelled():
            failed(current, "abandoned")
        elif (exc := finished.exception()) is not None:
            current.record_exception(exc)
            failed(current, f"{type(exc).__name__}: {exc}")
        current.end()

    task.add_done_callback(done)
