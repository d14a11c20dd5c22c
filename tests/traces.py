"""Seeing the spans runwire makes: in this process (an in-memory exporter), or from
service processes (a small OTLP/HTTP collector that the services export to)."""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import StatusCode

STATUS_CODE_ERROR = 2  # OTLP's Status.STATUS_CODE_ERROR


@dataclass(frozen=True)
class SeenSpan:
    """A finished span, from either source, reduced to what tests look at."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str | None
    service: str
    attributes: dict[str, Any]
    failed: bool = False

    @classmethod
    def of(cls, span: ReadableSpan) -> SeenSpan:
        ctx = span.get_span_context()
        assert ctx is not None
        return cls(
            name=span.name,
            trace_id=f"{ctx.trace_id:032x}",
            span_id=f"{ctx.span_id:016x}",
            parent_id=f"{span.parent.span_id:016x}" if span.parent else None,
            service=str(span.resource.attributes.get("service.name", "")),
            attributes=dict(span.attributes or {}),
            failed=span.status.status_code == StatusCode.ERROR,
        )


def of_run(spans: list[SeenSpan], run_id: str) -> list[SeenSpan]:
    return [s for s in spans if s.attributes.get("run_id") == run_id]


class _OwnRandomIds(IdGenerator):
    """Span and trace ids from a generator of our own: the SDK's default draws from the
    `random` module, which Hypothesis reports when it happens during a property test."""

    def __init__(self) -> None:
        self._rng = random.Random()

    def generate_span_id(self) -> int:
        return self._rng.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        return self._rng.getrandbits(128) or 1


class InProcessSpans:
    """The test process's tracer provider: spans are kept while a test records them."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()

    def install(self) -> None:
        provider = TracerProvider(id_generator=_OwnRandomIds())
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        trace.set_tracer_provider(provider)

    @property
    def spans(self) -> list[SeenSpan]:
        return [SeenSpan.of(s) for s in self.exporter.get_finished_spans()]

    def clear(self) -> None:
        self.exporter.clear()


class OtlpCollector:
    """Receives OTLP/HTTP protobuf exports on 127.0.0.1, like a collector's port 4318."""

    def __init__(self) -> None:
        self.spans: list[SeenSpan] = []
        self._lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                collector._add(request)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def _add(self, request: ExportTraceServiceRequest) -> None:
        seen: list[SeenSpan] = []
        for resource_spans in request.resource_spans:
            service = next(
                (
                    a.value.string_value
                    for a in resource_spans.resource.attributes
                    if a.key == "service.name"
                ),
                "",
            )
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    seen.append(
                        SeenSpan(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex() or None,
                            service=service,
                            attributes={a.key: _value(a.value) for a in span.attributes},
                            failed=span.status.code == STATUS_CODE_ERROR,
                        )
                    )
        with self._lock:
            self.spans.extend(seen)

    def snapshot(self) -> list[SeenSpan]:
        with self._lock:
            return list(self.spans)

    def __enter__(self) -> OtlpCollector:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None
