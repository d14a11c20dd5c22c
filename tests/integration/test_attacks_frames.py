"""Attacks through what a run produces (issue 32): frames Postgres cannot store, error
text that carries secrets, jobs no executor serves."""

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from runwire.client import Client
from runwire.contracts.errors import ErrorCode
from runwire.contracts.frames import Frame, FrameType
from runwire.contracts.identities import OPERATOR, tenant_user
from runwire.contracts.status import RunStatus
from runwire.contracts.subjects import Subjects, inbox_prefix
from runwire.relay.segments import SegmentBuffer, SegmentWriter
from runwire.runtime.broker import Broker
from runwire.runtime.logs import JsonFormatter
from runwire.runtime.settings import RelaySettings
from runwire.testing.servers import Servers
from tests.runners import FAKE_SECRET, echo, leaky, leaky_tool, unstorable
from tests.secured import ON_A_CLUSTER
from tests.secured import Broker as SecuredBroker
from tests.services import InProcessStack, all_frames_stored, collect, eventually

pytestmark = [pytest.mark.integration, pytest.mark.security, ON_A_CLUSTER]

REPLACED = "\ufffd"
OTHER_TOKENS = [f"w{i} " for i in range(30)]


@pytest.fixture
async def frames_stack(infra: Servers, db_url: str, prefix: str) -> AsyncIterator[InProcessStack]:
    """The stack with the `unstorable` runner; a run's frames leave the stream soon after
    it ended, so a re-join after the end is served from Postgres."""
    async with InProcessStack(
        infra.nats_url,
        db_url,
        prefix,
        db_roles=infra.service_roles,
        runners={"unstorable": unstorable},
        overrides={
            "stream_replicas": infra.stream_replicas,
            "stream_purge_grace": timedelta(milliseconds=300),
        },
    ) as stack:
        yield stack


async def _stream_holds_none(stack: InProcessStack, tenant: str, run_id: str) -> bool:
    info = await stack.client.nc.jetstream().stream_info(
        stack.client.subjects.run_frames_stream,
        subjects_filter=stack.client.subjects.run_frames(tenant, run_id),
    )
    return not info.state.subjects


async def test_a_nul_in_a_frame_stalls_no_other_tenant(
    frames_stack: InProcessStack, infra: Servers
) -> None:
    stack = frames_stack
    async with await Client.connect(infra.nats_url, prefix=stack.prefix, tenant="acme") as acme:
        other = await acme.submit({"tokens": OTHER_TOKENS, "token_delay_ms": 20})
        following = asyncio.create_task(collect(acme, other.run.run_id, timeout=60))
        bad = await stack.client.submit({}, runner="unstorable")
        bad_id = bad.run.run_id
        live, live_text = await collect(stack.client, bad_id, timeout=60)
        other_frames, other_text = await following

        # The other tenant's run streamed and finished, and Postgres has all its frames.
        assert other_text.text == "".join(OTHER_TOKENS)
        assert (await acme.get(other.run.run_id)).status == RunStatus.FINISHED
        await eventually(
            lambda: all_frames_stored(stack.store, other.run.run_id, len(other_frames)),
            timeout=20,
        )

        # The bad run finished, each unstorable character replaced by U+FFFD, the same in
        # its live frames, its result, and a re-join once the stream dropped it.
        expected = f"before{REPLACED}after" + f"half {REPLACED} a pair"
        assert live_text.text == expected
        statuses = [f.data["status"] for f in live if f.type == FrameType.STATUS]
        assert statuses == [f"thinking{REPLACED}"]
        run = await stack.client.get(bad_id)
        assert run.status == RunStatus.FINISHED
        assert run.result == {"text": expected, "note": f"before{REPLACED}after"}
        await eventually(lambda: all_frames_stored(stack.store, bad_id, len(live)), timeout=20)
        await eventually(lambda: _stream_holds_none(stack, "default", bad_id), timeout=20)
        again, again_text = await collect(stack.client, bad_id, timeout=30)
        assert [f.model_dump() for f in again] == [f.model_dump() for f in live]
        assert again_text.text == expected


async def test_a_nul_an_attempt_did_not_replace_is_replaced_in_the_archive(
    infra: Servers, db_url: str, prefix: str
) -> None:
    """A faulty attempt publishes a frame holding a NUL: the relay archives it with U+FFFD
    in its place, and another tenant's run meanwhile streams, finishes and is stored."""
    stack = InProcessStack(
        infra.nats_url,
        db_url,
        prefix,
        db_roles=infra.service_roles,
        overrides={"stream_replicas": infra.stream_replicas},
    )
    await stack.start(executors=0)
    broker = await Broker.connect(stack.nats_url, Subjects(stack.prefix), name="old-executor")
    try:
        reply = await stack.client.submit({"tokens": ["unused"]})
        run_id = reply.run.run_id
        claimed = await eventually(lambda: stack.store.claim(run_id, 0, "old", 60_000))
        after = 0
        for seq, (type_, data) in enumerate(
            (
                (FrameType.RUN, {"attempt": 1, "resumed": False, "partial_length": 0}),
                (FrameType.MESSAGE, {"text": "x\x00y"}),
                (FrameType.DONE, {"status": "finished"}),
            ),
            start=1,
        ):
            frame = Frame(run_id=run_id, seq=seq, type=type_, data=data, at=datetime.now(UTC))
            sent = await broker.send_frame(
                "default", frame, frame.model_dump_json().encode(), claimed.generation, seq, after
            )
            after = await sent
        live, live_text = await collect(stack.client, run_id, timeout=30)

        stack.start_executor()
        async with await Client.connect(infra.nats_url, prefix=stack.prefix, tenant="acme") as acme:
            other = await acme.submit({"tokens": OTHER_TOKENS})
            other_frames, other_text = await collect(acme, other.run.run_id, timeout=30)
            assert other_text.text == "".join(OTHER_TOKENS)
            await eventually(
                lambda: all_frames_stored(stack.store, other.run.run_id, len(other_frames)),
                timeout=20,
            )

        assert live_text.text == "x\x00y"
        await eventually(lambda: all_frames_stored(stack.store, run_id, len(live)), timeout=20)
        await stack.client.nc.jetstream().purge_stream(
            stack.client.subjects.run_frames_stream,
            subject=stack.client.subjects.run_frames("default", run_id),
        )
        again = await stack.client.join(run_id, 0)
        assert [f.seq for f in again.replay] == [f.seq for f in live]
        assert again.replay[1].data == {"text": f"x{REPLACED}y"}
    finally:
        await broker.close()
        await stack.close()


def _buffer(run_id: str, text: str) -> SegmentBuffer:
    body = Frame(
        run_id=run_id, seq=1, type=FrameType.MESSAGE, data={"text": text}, at=datetime.now(UTC)
    ).model_dump_json()
    return SegmentBuffer(run_id, 1, "default", last_seq=1, frames=[body], size=len(body))


async def test_a_segment_postgres_refuses_spoils_no_other_runs_segment(
    infra: Servers, db_url: str, prefix: str
) -> None:
    """One flush writes the segments of many runs in one statement: a segment Postgres
    refuses (a NUL, buffered by a relay of an earlier version) is left out, the others
    are written, and the relay does not try it again on every flush."""
    stack = InProcessStack(
        infra.nats_url,
        db_url,
        prefix,
        db_roles=infra.service_roles,
        overrides={"stream_replicas": infra.stream_replicas},
    )
    await stack.start(executors=0)
    settings = RelaySettings(nats_url=infra.nats_url, database_url=db_url, prefix=prefix)
    broker = await Broker.connect(stack.nats_url, Subjects(stack.prefix), name="test-relay")
    try:
        good = (await stack.client.submit({"tokens": ["a"]})).run.run_id
        bad = (await stack.client.submit({"tokens": ["b"]})).run.run_id
        segments = SegmentWriter(settings, stack.store, broker)
        segments.buffers = {good: _buffer(good, "fine"), bad: _buffer(bad, "x\x00y")}

        await segments.flush()

        (written,) = await stack.store.segments_after(good, 0)
        assert written.frames[0]["data"] == {"text": "fine"}
        assert await stack.store.segments_after(bad, 0) == []
        assert segments.buffers == {}
    finally:
        await broker.close()
        await stack.close()


class _Lines(logging.Handler):
    """The log lines the services write in this process, as JSON (their run context
    included)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(JsonFormatter())
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(self.format(record)))


@pytest.fixture
def log_lines() -> Iterator[_Lines]:
    handler = _Lines()
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield handler
    root.removeHandler(handler)
    root.setLevel(level)


async def test_no_exception_text_reaches_a_client(
    infra: Servers, db_url: str, prefix: str, log_lines: _Lines
) -> None:
    """A runner or a tool that raises an exception whose text holds a credential: what a
    client reads (frames live and on a re-join, the run, its events) names the exception's
    class at most; the executor's log has the whole of it, with the run. A RunnerError
    keeps its author's words."""
    async with InProcessStack(
        infra.nats_url,
        db_url,
        prefix,
        db_roles=infra.service_roles,
        runners={"leaky": leaky},
        tools={"leaky_tool": leaky_tool},
        overrides={"stream_replicas": infra.stream_replicas},
    ) as stack:
        runs = {
            how: (await stack.client.submit({"how": how}, runner="leaky", max_attempts=1)).run
            for how in ("crash", "tool", "own")
        }
        seen: dict[str, str] = {}
        for how, run in runs.items():
            live, transcript = await collect(stack.client, run.run_id, timeout=30)
            joined = await stack.client.join(run.run_id, 0)
            ended = await stack.client.get(run.run_id)
            events = await stack.store.run_events(run.run_id)
            seen[how] = json.dumps(
                {
                    "live": [f.model_dump(mode="json") for f in live],
                    "joined": [f.model_dump(mode="json") for f in joined.replay],
                    "run": ended.model_dump(mode="json"),
                    "events": events,
                },
                default=str,
            )
            if how == "tool":
                assert ended.status == RunStatus.FINISHED
                assert transcript.text == (
                    "the tool said: the tool 'leaky_tool' failed unexpectedly "
                    "(ConnectionError); the executor logged the details with the run_id"
                )
            else:
                assert ended.status == RunStatus.FAILED
                assert ended.error is not None
                errors = [f.data["message"] for f in live if f.type == FrameType.ERROR]
                assert errors == [ended.error.message]
        assert runs["crash"].run_id in seen["crash"]
        crash = await stack.client.get(runs["crash"].run_id)
        own = await stack.client.get(runs["own"].run_id)

    for how, text in seen.items():
        assert FAKE_SECRET not in text, how
    assert crash.error is not None
    assert own.error is not None
    assert crash.error.message == (
        "the runner failed unexpectedly (ValueError); the executor logged the details "
        "with the run_id"
    )
    assert own.error.message == "the search index is not ready"
    for how in ("crash", "tool"):
        logged = [
            line
            for line in log_lines.lines
            if line.get("run_id") == runs[how].run_id and FAKE_SECRET in line.get("exc", "")
        ]
        assert logged, how


@contextlib.asynccontextmanager
async def _unserved(
    infra: Servers, db_url: str, prefix: str, **overrides: Any
) -> AsyncIterator[InProcessStack]:
    """A stack whose submitter knows the runner `echo` and whose executor does not serve
    it (the installed runners only)."""
    stack = InProcessStack(
        infra.nats_url,
        db_url,
        prefix,
        db_roles=infra.service_roles,
        runners={"echo": echo},
        overrides={"stream_replicas": infra.stream_replicas, **overrides},
    )
    await stack.start(executors=0)
    try:
        stack.start_executor(runners={})
        yield stack
    finally:
        await stack.close()


async def _failed_by_queue_timeout(stack: InProcessStack, run_id: str) -> str:
    """Check that the run ended failed with QUEUE_TIMEOUT, in its frames and in `get`;
    its error's message."""
    frames, _ = await collect(stack.client, run_id, timeout=20)
    assert frames[-1].data == {"status": "failed", "code": "QUEUE_TIMEOUT"}
    ended = await stack.client.get(run_id)
    assert ended.status == RunStatus.FAILED
    assert ended.error is not None
    assert ended.error.code == ErrorCode.QUEUE_TIMEOUT
    return ended.error.message


async def _jobs_of(stack: InProcessStack, runner: str) -> int:
    """How many jobs of `runner` the jobs stream holds."""
    subjects = stack.client.subjects
    info = await stack.client.nc.jetstream().stream_info(
        subjects.jobs_stream, subjects_filter=subjects.job(runner, "*")
    )
    return sum((info.state.subjects or {}).values())


async def test_jobs_no_executor_serves_leave_the_queue_by_their_queue_timeout(
    infra: Servers, db_url: str, prefix: str
) -> None:
    """Runs of a runner the submitter knows but no executor serves (installed beside the
    submitter only): each fails with QUEUE_TIMEOUT once its queue timeout passed, and
    its job leaves the jobs stream, where it would hold a place of the queue (and
    with enough of them, every tenant would get QUEUE_FULL)."""
    async with _unserved(infra, db_url, prefix) as stack:
        runs = [
            (await stack.client.submit({"text": "hi"}, runner="echo", queue_timeout_ms=500)).run
            for _ in range(3)
        ]
        assert await _jobs_of(stack, "echo") == 3
        scripted = await stack.client.submit({"tokens": ["still", " served"]})
        _, transcript = await collect(stack.client, scripted.run.run_id)

        for run in runs:
            await _failed_by_queue_timeout(stack, run.run_id)
        await eventually(lambda: _no_jobs_of(stack, "echo"), timeout=10)
        assert transcript.text == "still served"


async def _no_jobs_of(stack: InProcessStack, runner: str) -> bool:
    return await _jobs_of(stack, runner) == 0


async def test_jobs_no_executor_serves_leave_the_queue_without_a_queue_timeout(
    infra: Servers, db_url: str, prefix: str
) -> None:
    """Runs with no queue timeout, under a runner no executor has ever served: they fail
    with QUEUE_TIMEOUT once they waited `unserved_timeout_ms`, saying why, and their jobs
    leave the jobs stream; runs of a runner an executor serves are not touched."""
    async with _unserved(infra, db_url, prefix, unserved_timeout_ms=500) as stack:
        runs = [(await stack.client.submit({"text": "hi"}, runner="echo")).run for _ in range(3)]
        assert await _jobs_of(stack, "echo") == 3
        scripted = await stack.client.submit({"tokens": ["t "] * 30, "token_delay_ms": 30})
        _, transcript = await collect(stack.client, scripted.run.run_id)

        for run in runs:
            ended = await _failed_by_queue_timeout(stack, run.run_id)
            assert "no executor serves the run's runner" in ended
        await eventually(lambda: _no_jobs_of(stack, "echo"), timeout=10)
        # The scripted run, which took longer than `unserved_timeout_ms`, finished.
        assert transcript.text == "t " * 30
        assert (await stack.client.get(scripted.run.run_id)).status == RunStatus.FINISHED


async def test_jobs_of_canceled_runs_no_executor_serves_leave_the_queue(
    infra: Servers, db_url: str, prefix: str
) -> None:
    """Runs queued under a runner no executor serves, canceled before their queue
    timeout: their jobs, which no executor would ever take, leave the jobs stream."""
    async with _unserved(infra, db_url, prefix, republish_after_ms=200) as stack:
        runs = [(await stack.client.submit({"text": "hi"}, runner="echo")).run for _ in range(3)]
        assert await _jobs_of(stack, "echo") == 3
        for run in runs:
            assert (await stack.client.cancel(run.run_id)).status == RunStatus.CANCELED
        await eventually(lambda: _no_jobs_of(stack, "echo"), timeout=10)


async def test_on_a_broker_that_enforces_identities_recovery_removes_such_jobs(
    broker: SecuredBroker, db_url: str, prefix: str
) -> None:
    """The same as its service identity: recovery may purge a job's subject from the
    jobs stream (and nothing else of it)."""
    s = broker.subjects
    stack = InProcessStack(
        broker.services_url,
        db_url,
        prefix,
        identities=broker.identities,
        runners={"echo": echo},
        overrides={"stream_replicas": broker.replicas},
    )
    await stack.start(executors=0)
    operator, _ = await broker.connect(OPERATOR)

    async def jobs_left() -> int:
        info = await operator.jetstream().stream_info(
            s.jobs_stream, subjects_filter=s.job("echo", "*")
        )
        return sum((info.state.subjects or {}).values())

    try:
        stack.start_executor(runners={})  # the installed runners only: not `echo`
        run = (await stack.client.submit({"text": "hi"}, runner="echo", queue_timeout_ms=500)).run
        assert await jobs_left() == 1
        await _failed_by_queue_timeout(stack, run.run_id)
        await eventually(lambda: _none(jobs_left), timeout=10)
    finally:
        await operator.close()
        await stack.close()


async def _none(count: Any) -> bool:
    return bool(await count() == 0)


async def test_frames_a_tenant_forges_are_refused_by_the_broker(
    broker: SecuredBroker, secured: InProcessStack
) -> None:
    """A tenant publishes a frame of its own run where executors publish them, and on the
    run's client subject, fenced right after the run's last frame: the broker refuses
    both, and the run's frames are only its attempt's."""
    s = broker.subjects
    acme = await broker.tenant("acme")
    nc, errors = await broker.connect(tenant_user("acme"), inbox=inbox_prefix("acme"))
    try:
        run_id = (
            await acme.submit({"tokens": [f"t{i} " for i in range(10)], "token_delay_ms": 50})
        ).run.run_id
        following = acme.stream(run_id)
        first = await anext(following)
        forged = (
            Frame(
                run_id=run_id,
                seq=first.seq + 1,
                type=FrameType.DONE,
                data={"status": "finished"},
                at=datetime.now(UTC),
            )
            .model_dump_json()
            .encode()
        )
        for subject in (s.frames_out("acme", run_id), s.run_frames("acme", run_id)):
            await nc.publish(subject, forged, headers={"Rw-Pos": f"1 2 {first.seq + 1} done"})
        await nc.flush()
        await eventually(lambda: sum("publish" in e.lower() for e in errors) >= 2)
        frames = [first, *[frame async for frame in following]]
    finally:
        await nc.close()
        await acme.close()
    assert [f.seq for f in frames] == list(range(1, len(frames) + 1))
    assert "".join(f.data.get("text", "") for f in frames) == "".join(f"t{i} " for i in range(10))
    assert [f.type for f in frames].count(FrameType.DONE) == 1


async def _first_frame(client: Client, run_id: str) -> Frame:
    async for frame in client.stream(run_id):
        return frame
    raise AssertionError("the run's stream ended with no frame")
