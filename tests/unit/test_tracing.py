"""Which span exporter the standard OTEL_* environment selects, and what a bad one does."""

import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from runwire.runtime import tracing
from runwire.runtime.tracing import TracingConfigError, exporters_from_env

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, []),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ["otlp"]),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, ["otlp"]),
        ({"OTEL_TRACES_EXPORTER": "console"}, ["console"]),
        ({"OTEL_TRACES_EXPORTER": "otlp, console"}, ["otlp", "console"]),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, []),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
            ["otlp"],
        ),
    ],
)
def test_the_environment_chooses_the_exporters(env: dict[str, str], expected: list[str]) -> None:
    assert exporters_from_env(env) == expected


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"OTEL_TRACES_EXPORTER": "jaeger"}, "unknown exporter 'jaeger'"),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "'grpc'"),
    ],
)
def test_an_exporter_runwire_cannot_use_is_refused_by_name(env: dict[str, str], says: str) -> None:
    with pytest.raises(TracingConfigError, match=says):
        exporters_from_env(env)


def test_a_disabled_sdk_installs_no_tracer_provider() -> None:
    assert tracing.setup("relay", {"OTEL_SDK_DISABLED": "true"}) is None


def test_a_service_with_an_unknown_exporter_stops_at_once_with_one_clear_line() -> None:
    env = {"PATH": "/usr/bin:/bin", "OTEL_TRACES_EXPORTER": "zipkin", "RUNWIRE_LOG_FORMAT": "json"}
    done = subprocess.run(
        [sys.executable, "-m", "runwire.relay"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "unknown exporter 'zipkin'" in done.stderr
    assert "Traceback" not in done.stderr


class _Unanswered(SpanExporter):
    """A collector that never answers: every export hangs until the test ends."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Event()
        self.finished = threading.Event()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.started.set()
        self.release.wait(10)
        self.finished.set()
        return SpanExportResult.FAILURE


def test_a_collector_that_does_not_answer_does_not_hold_a_stopping_service() -> None:
    exporter = _Unanswered()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    provider.get_tracer("test").start_span("a span").end()
    try:
        tracing.shutdown(provider, wait_s=0.2)
        # It returned while the export was (or was about to be) still hanging.
        assert exporter.started.wait(5)
        assert not exporter.finished.is_set()
    finally:
        exporter.release.set()
