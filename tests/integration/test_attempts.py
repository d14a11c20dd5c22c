"""Attempts: retries with the text kept, fatal errors, deadlines, cancellation, timeouts."""

import asyncio
import time

import nats.js.errors
import pytest

from runwire.contracts.errors import ErrorCode
from runwire.contracts.frames import FrameType
from runwire.contracts.status import RunStatus
from runwire.contracts.subjects import Subjects
from runwire.executor.main import Executor
from runwire.runners.base import AttemptContext, RunnerSpec
from runwire.runtime.broker import Broker
from runwire.runtime.settings import ExecutorSettings
from runwire.runtime.store import Store
from runwire.testing.servers import Servers
from runwire.testing.waiting import eventually
from tests.services import InProcessStack, assert_well_formed, collect

pytestmark = pytest.mark.integration

TOKENS = [f"w{i} " for i in range(10)]


async def test_retryable_failure_resumes_and_keeps_every_token_once(
    stack: InProcessStack,
) -> None:
    script = {"tokens": TOKENS, "fail": [{"attempt": 1, "after_tokens": 4, "kind": "retryable"}]}
    reply = await stack.client.submit(script)

    frames, transcript = await collect(stack.client, reply.run.run_id)

    assert_well_formed(frames)
    assert transcript.text == "".join(TOKENS)
    runs = [f.data for f in frames if f.type == FrameType.RUN]
    assert runs[0] == {"attempt": 1, "resumed": False, "partial_length": 0}
    assert runs[1]["attempt"] == 2
    assert runs[1]["resumed"] is True
    # A retry takes nothing back: it continues after every frame of the first attempt.
    second = next(f for f in frames if f.type == FrameType.RUN and f.data["attempt"] == 2)
    before = [f for f in frames if f.seq < second.seq]
    assert runs[1]["resume_after"] == before[-1].seq
    assert runs[1]["partial_length"] == len("".join(TOKENS[:4]))
    errors = [f.data for f in frames if f.type == FrameType.ERROR]
    assert errors[0]["code"] == ErrorCode.RUNNER_ERROR
    assert errors[0]["retryable"] is True
    run = await stack.client.get(reply.run.run_id)
    assert (run.status, run.attempts) == (RunStatus.FINISHED, 2)
    assert run.result == {"text": "".join(TOKENS)}


async def test_retries_stop_at_max_attempts_with_the_last_error(stack: InProcessStack) -> None:
    fail = [{"attempt": n, "after_tokens": 1, "kind": "retryable"} for n in (1, 2, 3)]
    reply = await stack.client.submit({"tokens": TOKENS, "fail": fail}, max_attempts=2)

    frames, _ = await collect(stack.client, reply.run.run_id)

    assert frames[-1].data == {"status": "failed", "code": "RUNNER_ERROR"}
    run = await stack.client.get(reply.run.run_id)
    assert (run.status, run.attempts) == (RunStatus.FAILED, 2)
    assert run.error is not None
    assert run.error.code == ErrorCode.RUNNER_ERROR


async def test_fatal_error_fails_at_once(stack: InProcessStack) -> None:
    fail = [{"attempt": 1, "after_tokens": 2, "kind": "fatal"}]
    reply = await stack.client.submit({"tokens": TOKENS, "fail": fail})

    frames, transcript = await collect(stack.client, reply.run.run_id)

    assert transcript.text == "".join(TOKENS[:2])
    assert frames[-1].data == {"status": "failed", "code": "RUNNER_FATAL"}
    run = await stack.client.get(reply.run.run_id)
    assert (run.status, run.attempts) == (RunStatus.FAILED, 1)


async def test_a_hanging_runner_is_abandoned_at_its_deadline(stack: InProcessStack) -> None:
    fail = [{"attempt": 1, "after_tokens": 3, "kind": "hang"}]
    started = time.monotonic()
    reply = await stack.client.submit(
        {"tokens": TOKENS, "fail": fail}, attempt_timeout_ms=500, max_attempts=2
    )

    frames, transcript = await collect(stack.client, reply.run.run_id)

    # The second attempt continues after the three tokens the first one delivered.
    assert transcript.text == "".join(TOKENS)
    timeouts = [f.data for f in frames if f.type == FrameType.ERROR]
    assert timeouts[0]["code"] == ErrorCode.ATTEMPT_TIMEOUT
    assert time.monotonic() - started < 10
    run = await stack.client.get(reply.run.run_id)
    assert (run.status, run.attempts) == (RunStatus.FINISHED, 2)


async def test_cancel_stops_a_running_attempt(stack: InProcessStack) -> None:
    reply = await stack.client.submit({"tokens": TOKENS * 20, "token_delay_ms": 50})
    run_id = reply.run.run_id
    await eventually(lambda: _status(stack, run_id, RunStatus.RUNNING))

    answered = await stack.client.cancel(run_id)
    asked_at = time.monotonic()
    frames, transcript = await collect(stack.client, run_id)

    assert answered.run_id == run_id
    assert frames[-1].data == {"status": "canceled", "code": "CANCELED"}
    assert time.monotonic() - asked_at < 2
    assert len(transcript.text) < len("".join(TOKENS * 20))
    run = await stack.client.get(run_id)
    assert run.status == RunStatus.CANCELED
    # Cancelling a terminal run answers with the run unchanged (the relay may still be
    # writing its last frames: last_seq and frames_complete, which are not changes of the
    # run; its budget is told by `get` only).
    again = await stack.client.cancel(run_id)
    assert again.budget is None
    stored = {"last_seq", "frames_complete", "budget"}
    assert again.model_dump(exclude=stored) == run.model_dump(exclude=stored)


async def test_a_canceled_queued_run_never_starts(stack: InProcessStack) -> None:
    await stack.stop_service("executor-0")
    reply = await stack.client.submit({"tokens": ["never"]})

    canceled = await stack.client.cancel(reply.run.run_id)
    assert canceled.status == RunStatus.CANCELED
    stack.start_executor("executor-1")
    frames, transcript = await collect(stack.client, reply.run.run_id)

    assert transcript.text == ""
    assert [f.type for f in frames] == [FrameType.DONE]
    assert frames[0].data == {"status": "canceled", "code": "CANCELED"}
    # The executor has taken the run's job off the queue (and must not have started it).
    await eventually(lambda: _job_gone(stack, reply.run.run_id), timeout=10)
    run = await stack.client.get(reply.run.run_id)
    assert (run.status, run.attempts, run.started_at) == (RunStatus.CANCELED, 0, None)


async def test_a_run_past_its_queue_timeout_fails_without_starting(
    stack: InProcessStack,
) -> None:
    await stack.stop_service("executor-0")
    reply = await stack.client.submit({"tokens": ["late"]}, queue_timeout_ms=300)

    frames, _ = await collect(stack.client, reply.run.run_id)

    assert frames[-1].data == {"status": "failed", "code": "QUEUE_TIMEOUT"}
    assert frames[0].type == FrameType.ERROR
    run = await stack.client.get(reply.run.run_id)
    assert (run.status, run.attempts) == (RunStatus.FAILED, 0)
    assert run.error is not None
    assert run.error.code == ErrorCode.QUEUE_TIMEOUT


async def _job_gone(stack: InProcessStack, run_id: str) -> bool:
    js = stack.client.nc.jetstream()
    subjects = stack.client.subjects
    try:
        await js.get_last_msg(subjects.jobs_stream, subjects.job("scripted", run_id))
    except nats.js.errors.NotFoundError:
        return True
    return False


async def _status(stack: InProcessStack, run_id: str, status: RunStatus) -> bool:
    return (await stack.client.get(run_id)).status == status


async def test_a_frame_whose_data_does_not_fit_its_type_fails_the_run_without_a_gap(
    infra: Servers, db_url: str, prefix: str
) -> None:
    async def sloppy(ctx: AttemptContext) -> dict[str, object]:
        await ctx.message("before ")
        await ctx.emit(FrameType.TOOL_CALL, {"tool": "search"})  # no id, no name
        return {}

    async with InProcessStack(infra.nats_url, db_url, prefix, executors=0) as stack:
        store = await Store.connect(db_url, pool_size=2)
        broker = await Broker.connect(infra.nats_url, Subjects(prefix), name="test-executor")
        stop = asyncio.Event()
        settings = stack.settings(ExecutorSettings, executor_id="sloppy")
        executor = asyncio.create_task(
            Executor(settings, store, broker, runners={"scripted": RunnerSpec(sloppy)}).run(stop)
        )
        try:
            reply = await stack.client.submit({"tokens": ["unused"]})
            frames, transcript = await collect(stack.client, reply.run.run_id)
        finally:
            stop.set()
            await executor
            await broker.close()
            await store.close()

    assert_well_formed(frames)  # the refused frame took no seq: the `done` is not held up
    assert transcript.text == "before "
    error = next(f.data for f in frames if f.type == FrameType.ERROR)
    assert error["code"] == ErrorCode.INVALID_REQUEST
    assert "tool_call" in error["message"]
    assert error["retryable"] is False
    assert frames[-1].data == {"status": "failed", "code": "INVALID_REQUEST"}
