"""One trace per run: from the submit command through every attempt and recovery
decision to the relay's flushes, carried by NATS headers and the run's row."""

from __future__ import annotations

import json
import logging
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
from faststream.nats import NatsBroker
from faststream.nats.opentelemetry import NatsTelemetryMiddleware
from nats.aio.msg import Msg
from opentelemetry import trace

from runwire.client.settings import server_urls
from runwire.contracts.commands import SubmitCommand
from runwire.contracts.headers import TRACEPARENT
from runwire.contracts.replies import SubmitReply
from runwire.contracts.status import RunStatus
from runwire.runtime.logs import JsonFormatter
from runwire.testing.waiting import eventually
from tests.services import MODULES, InProcessStack, ProcessStack, collect
from tests.traces import InProcessSpans, OtlpCollector, SeenSpan, of_run

pytestmark = pytest.mark.integration

RETRIED_ONCE = {
    "tokens": ["a", "b", "c", "d"],
    "fail": [{"attempt": 1, "after_tokens": 2, "kind": "retryable"}],
}


def by_id(spans: list[SeenSpan]) -> dict[str, SeenSpan]:
    return {s.span_id: s for s in spans}


async def test_a_retried_run_is_one_trace_from_submit_to_its_last_flush(
    stack: InProcessStack, spans: InProcessSpans
) -> None:
    run_id = (await stack.client.submit(RETRIED_ONCE)).run.run_id
    await collect(stack.client, run_id)

    def finished_and_flushed() -> list[SeenSpan]:
        mine = of_run(spans.spans, run_id)
        names = Counter(s.name for s in mine)
        done = any(s.attributes.get("decision") == "finished" for s in mine)
        flushed_gen2 = any(
            s.name == "relay flush" and s.attributes.get("generation") == 2 for s in mine
        )
        assert done, names
        assert flushed_gen2, names
        assert names["runner"] == 2, names
        return mine

    mine = await eventually(finished_and_flushed, timeout=10)
    assert len({s.trace_id for s in mine}) == 1, {(s.name, s.trace_id) for s in mine}
    names = Counter(s.name for s in mine)
    assert names["command submit"] == 1
    assert (names["claim"], names["attempt"], names["runner"]) == (2, 2, 2)
    assert names["relay flush"] >= 2

    spans_by_id = by_id(mine)
    submit = next(s for s in mine if s.name == "command submit")
    assert submit.attributes["tenant"] == "default"
    retry = next(s for s in mine if s.name == "retry decision")
    assert (retry.attributes["decision"], retry.attributes["code"]) == ("retry", "RUNNER_ERROR")
    assert retry.attributes["attempt"] == 1
    # The retry's job waited in the outbox until due; the sweep published it.
    due = next(s for s in mine if s.name == "outbox publish")

    attempts = sorted(
        (s for s in mine if s.name == "attempt"), key=lambda s: int(s.attributes["attempt"])
    )
    assert [(a.attributes["attempt"], a.attributes["generation"]) for a in attempts] == [
        (1, 1),
        (2, 2),
    ]
    # Attempt 1 came from the submit's job; attempt 2 from the job its retry decision
    # queued, published by the sweep once due: the context went through the outbox row
    # and each job's NATS headers.
    assert attempts[0].parent_id == submit.span_id
    assert attempts[1].parent_id == due.span_id
    assert due.parent_id == retry.span_id
    assert retry.parent_id == attempts[0].span_id
    # Each flush descends from the attempt whose frames it wrote (their headers): the
    # runner's frames from the attempt, its closing frames from the attempt's outcome.
    for flush in (s for s in mine if s.name == "relay flush"):
        parent = spans_by_id[flush.parent_id or ""]
        if parent.name in ("outcome", "retry decision"):
            parent = spans_by_id[parent.parent_id or ""]
        assert parent.name == "attempt"
        assert parent.attributes["generation"] == flush.attributes["generation"]


async def test_a_submit_inside_the_callers_span_joins_the_callers_trace(
    stack: InProcessStack, spans: InProcessSpans
) -> None:
    with trace.get_tracer("a product").start_as_current_span("answer the user") as caller:
        run_id = (await stack.client.submit({"tokens": ["x"]})).run.run_id
    await collect(stack.client, run_id)
    caller_trace = f"{caller.get_span_context().trace_id:032x}"

    mine = await eventually(
        lambda: (
            [s for s in of_run(spans.spans, run_id) if s.name == "outcome"]
            and of_run(spans.spans, run_id)
        )
    )
    assert {s.trace_id for s in mine} == {caller_trace}


@pytest.mark.parametrize(
    "traceparent",
    [
        "garbage",
        "00-" + "0" * 32 + "-" + "0" * 16 + "-01",  # all-zero ids
        "ff-" + "a" * 32 + "-" + "b" * 16 + "-01",  # a version that does not exist
    ],
)
async def test_a_malformed_traceparent_starts_a_new_trace_and_the_run_goes_on(
    stack: InProcessStack, spans: InProcessSpans, traceparent: str
) -> None:
    subject = stack.client.subjects.command("default", "submit")
    msg = await stack.client.nc.request(
        subject,
        b'{"request_id": "r-1", "input": {"tokens": ["x"]}}',
        headers={TRACEPARENT: traceparent},
        timeout=10,
    )
    run_id = SubmitReply.model_validate_json(msg.data).run.run_id
    _, transcript = await collect(stack.client, run_id)
    assert transcript.text == "x"
    submit = await eventually(
        lambda: [s for s in of_run(spans.spans, run_id) if s.name == "command submit"]
    )
    # A trace of its own, not the bad header's: FastStream starts it with a span for the
    # request it received, as for a request without any trace context.
    root = by_id(spans.spans)[submit[0].parent_id or ""]
    assert (root.name, root.parent_id) == (f"{subject} create", None)
    assert submit[0].trace_id == root.trace_id != "a" * 32


async def test_run_events_carry_the_runs_trace(
    stack: InProcessStack, spans: InProcessSpans
) -> None:
    headers: list[dict[str, str]] = []

    async def keep(msg: Msg) -> None:
        headers.append(dict(msg.headers or {}))

    await stack.client.nc.subscribe(stack.client.subjects.events_wildcard, cb=keep)
    run_id = (await stack.client.submit({"tokens": ["x"]})).run.run_id
    await collect(stack.client, run_id)

    events = await eventually(lambda: len(headers) >= 3 and headers)  # submitted .. finished
    trace_ids = {s.trace_id for s in of_run(spans.spans, run_id)}
    assert {h[TRACEPARENT].split("-")[1] for h in events} == trace_ids


async def test_a_run_submitted_by_a_faststream_app_joins_the_apps_trace(
    stack: InProcessStack, spans: InProcessSpans
) -> None:
    # A product written with FastStream and its telemetry middleware: its request carries
    # the `traceparent` header that runwire continues.
    broker = NatsBroker(server_urls(stack.nats_url), middlewares=[NatsTelemetryMiddleware()])
    await broker.connect()
    try:
        with trace.get_tracer("a product").start_as_current_span("answer the user") as caller:
            reply = await broker.request(
                {"request_id": "r-1", "input": {"tokens": ["x"]}},
                stack.client.subjects.command("default", "submit"),
                timeout=10,
            )
    finally:
        await broker.stop()
    run_id = SubmitReply.model_validate_json(reply.body).run.run_id
    await collect(stack.client, run_id)

    mine = await eventually(
        lambda: (
            [s for s in of_run(spans.spans, run_id) if s.name == "outcome"]
            and of_run(spans.spans, run_id)
        )
    )
    assert {s.trace_id for s in mine} == {f"{caller.get_span_context().trace_id:032x}"}
    submit = next(s for s in mine if s.name == "command submit")
    publisher = by_id(spans.spans)[submit.parent_id or ""]
    # FastStream's own span for the message it sent.
    assert publisher.name == f"{stack.client.subjects.command('default', 'submit')} create"


async def test_a_lease_lost_to_a_newer_attempt_shows_as_a_failed_heartbeat_in_the_trace(
    stack: InProcessStack, spans: InProcessSpans
) -> None:
    long_run = {"tokens": [f"t{i} " for i in range(100)], "token_delay_ms": 20}
    run_id = (await stack.client.submit(long_run)).run.run_id
    await eventually(lambda: _running(stack, run_id))
    # What recovery does to an attempt whose executor stalled: a newer generation fences
    # the running attempt out; its next lease renewal finds out.
    conn = await asyncpg.connect(stack.db_url)
    try:
        await conn.execute(
            "UPDATE runs SET generation = generation + 1 WHERE run_id = $1", uuid.UUID(run_id)
        )
    finally:
        await conn.close()

    failures = await eventually(
        lambda: [s for s in of_run(spans.spans, run_id) if s.name == "heartbeat failure"]
    )
    assert failures[0].failed
    assert failures[0].attributes["reason"] == "lease lost to a newer attempt"
    assert failures[0].attributes["generation"] == 1
    lost = await eventually(
        lambda: [s for s in of_run(spans.spans, run_id) if s.attributes.get("decision") == "lost"]
    )
    mine = of_run(spans.spans, run_id)
    assert {s.trace_id for s in mine} == {lost[0].trace_id}
    assert by_id(mine)[failures[0].parent_id or ""].name == "attempt"


async def _running(stack: InProcessStack, run_id: str) -> bool:
    run = await stack.client.get(run_id)
    return run.status == RunStatus.RUNNING


async def test_log_lines_of_an_attempt_carry_the_runs_trace_id(
    stack: InProcessStack, spans: InProcessSpans, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    lines: list[dict[str, object]] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(json.loads(JsonFormatter().format(record)))

    handler = Keep(level=logging.INFO)
    logging.getLogger().addHandler(handler)
    try:
        run_id = (await stack.client.submit({"tokens": ["x"]})).run.run_id
        await collect(stack.client, run_id)
        started = await eventually(
            lambda: [
                line
                for line in lines
                if line.get("run_id") == run_id and line["msg"] == "attempt started"
            ]
        )
    finally:
        logging.getLogger().removeHandler(handler)
    trace_ids = {s.trace_id for s in of_run(spans.spans, run_id)}
    assert len(trace_ids) == 1
    assert started[0]["trace_id"] in trace_ids
    assert started[0]["attempt"] == 1


@pytest.fixture
async def exported(
    service_env: dict[str, str], tmp_path: Path
) -> AsyncIterator[tuple[ProcessStack, OtlpCollector]]:
    """The four services as processes, exporting spans over OTLP to a local collector."""
    with OtlpCollector() as collector:
        env = {
            **service_env,
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
        env.pop("OTEL_TRACES_EXPORTER", None)
        stack = ProcessStack(env, tmp_path)
        for name in MODULES:
            stack.start(name)
        try:
            await stack.open()
            yield stack, collector
        finally:
            await stack.close()


async def test_service_processes_export_one_trace_per_run_over_otlp(
    exported: tuple[ProcessStack, OtlpCollector],
) -> None:
    stack, collector = exported
    run_id = (await stack.client.submit(RETRIED_ONCE)).run.run_id
    await collect(stack.client, run_id)

    def from_every_service() -> list[SeenSpan]:
        mine = of_run(collector.snapshot(), run_id)
        services = {s.service for s in mine}
        assert services == {f"runwire-{name}" for name in MODULES}, services
        assert any(s.attributes.get("decision") == "finished" for s in mine)
        return mine

    mine = await eventually(from_every_service, timeout=20)
    assert len({s.trace_id for s in mine}) == 1
    attempts = [s for s in mine if s.name == "attempt"]
    assert sorted(s.attributes["attempt"] for s in attempts) == [1, 2]


async def test_without_an_exporter_a_run_still_joins_the_callers_trace(
    service_env: dict[str, str], tmp_path: Path
) -> None:
    # A submitter that records no spans carries the caller's context all the same: the
    # run's stored trace context, which every later span would descend from, is the
    # caller's trace.
    env = {k: v for k, v in service_env.items() if not k.startswith("OTEL_")}
    stack = ProcessStack({**env, "OTEL_SDK_DISABLED": "true"}, tmp_path)
    stack.start("submitter")
    stack.start("relay")
    try:
        await stack.open()
        trace_id, span_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
        body = SubmitCommand(request_id="traced", input={"tokens": ["x"]})
        msg = await stack.client.nc.request(
            stack.client.subjects.command("default", "submit"),
            body.model_dump_json().encode(),
            timeout=10,
            headers={TRACEPARENT: f"00-{trace_id}-{span_id}-01"},
        )
        run_id = SubmitReply.model_validate_json(msg.data).run.run_id
        run = await stack.store.get_run_by_id(run_id)
        assert run is not None
        assert run.trace_parent is not None
        assert run.trace_parent.split("-")[1] == trace_id
    finally:
        await stack.close()
