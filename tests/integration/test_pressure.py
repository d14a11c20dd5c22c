"""Delivery under pressure: back-pressure, in-flight limit, heartbeats, fast cancel."""

import asyncio
import time
from datetime import datetime

import pytest

from runwire.client import ClientError
from runwire.contracts.errors import ErrorBody, ErrorCode
from runwire.contracts.frames import FrameType
from runwire.contracts.status import RunStatus
from runwire.testing.servers import Servers
from runwire.testing.waiting import eventually
from tests.services import InProcessStack, assert_well_formed, collect, max_running

pytestmark = pytest.mark.integration


@pytest.fixture
async def small_queue(infra: Servers, db_url: str, prefix: str):  # type: ignore[no-untyped-def]
    stack = InProcessStack(
        infra.nats_url,
        db_url,
        prefix,
        db_roles=infra.service_roles,
        overrides={"queue_capacity": 3},
    )
    await stack.start(executors=0)
    try:
        yield stack
    finally:
        await stack.close()


async def test_a_full_queue_answers_queue_full_and_records_the_run(
    small_queue: InProcessStack,
) -> None:
    stack = small_queue
    accepted = [await stack.client.submit({"tokens": [f"ok{i}"]}) for i in range(3)]

    with pytest.raises(ClientError) as refused:
        await stack.client.submit({"tokens": ["too many"]}, request_id="overflow")

    assert refused.value.code == ErrorCode.QUEUE_FULL
    assert refused.value.retryable is True
    run = await stack.store.run_by_request("default", "overflow")
    assert run is not None
    assert run.status == RunStatus.FAILED
    assert run.error is not None
    assert run.error.code == ErrorCode.QUEUE_FULL
    frames, _ = await collect(stack.client, run.run_id)
    assert frames[-1].data == {"status": "failed", "code": "QUEUE_FULL"}

    # Nothing accepted is lost: once an executor runs, every queued run finishes.
    stack.start_executor()
    for i, reply in enumerate(accepted):
        _, transcript = await collect(stack.client, reply.run.run_id)
        assert transcript.text == f"ok{i}"


async def test_a_run_longer_than_ack_wait_is_delivered_once(
    infra: Servers, db_url: str, prefix: str
) -> None:
    stack = InProcessStack(
        infra.nats_url, db_url, prefix, overrides={"ack_wait_ms": 1000, "heartbeat_ms": 200}
    )
    await stack.start()
    try:
        tokens = [f"{i} " for i in range(25)]
        reply = await stack.client.submit({"tokens": tokens, "token_delay_ms": 200})
        frames, transcript = await collect(stack.client, reply.run.run_id, timeout=30)

        assert transcript.text == "".join(tokens)
        assert [f.type for f in frames].count(FrameType.RUN) == 1
        run = await stack.client.get(reply.run.run_id)
        assert (run.status, run.attempts) == (RunStatus.FINISHED, 1)
        js = stack.client.nc.jetstream()
        info = await js.consumer_info(stack.client.subjects.jobs_stream, "executor-scripted")
        assert info.num_redelivered == 0
    finally:
        await stack.close()


async def test_cancel_aborts_the_attempt_within_100_ms(stack: InProcessStack) -> None:
    reply = await stack.client.submit({"tokens": ["x"] * 500, "token_delay_ms": 5})
    run_id = reply.run.run_id
    await eventually(lambda: _frames_at_least(stack, run_id, 5))

    await stack.client.cancel(run_id)
    replied = datetime.now().astimezone()
    frames, _ = await collect(stack.client, run_id)

    messages = [f for f in frames if f.type == FrameType.MESSAGE]
    assert len(messages) < 500
    late = (messages[-1].at - replied).total_seconds()
    assert late < 0.1, f"a token was emitted {late:.3f}s after the cancel reply"
    assert frames[-1].data == {"status": "canceled", "code": "CANCELED"}


async def test_cancel_is_noticed_by_polling_when_the_notice_is_lost(
    infra: Servers, db_url: str, prefix: str
) -> None:
    stack = InProcessStack(
        infra.nats_url,
        db_url,
        prefix,
        db_roles=infra.service_roles,
        overrides={"cancel_poll_ms": 50},
    )
    await stack.start()
    try:
        reply = await stack.client.submit({"tokens": ["y"] * 500, "token_delay_ms": 5})
        run_id = reply.run.run_id
        await eventually(lambda: _frames_at_least(stack, run_id, 5))
        # Mark the cancel in Postgres only, as if the NATS notice never arrived.
        canceled = ErrorBody(code=ErrorCode.CANCELED, message="test", retryable=False)
        await stack.store.request_cancel("default", run_id, canceled, "test")
        marked = time.monotonic()

        frames, _ = await collect(stack.client, run_id)

        assert frames[-1].data == {"status": "canceled", "code": "CANCELED"}
        assert time.monotonic() - marked < 2
    finally:
        await stack.close()


async def _frames_at_least(stack: InProcessStack, run_id: str, n: int) -> bool:
    return len((await stack.client.join(run_id, 0)).replay) >= n


async def test_many_runs_with_a_small_in_flight_limit_all_finish(
    infra: Servers, db_url: str, prefix: str
) -> None:
    stack = InProcessStack(
        infra.nats_url, db_url, prefix, db_roles=infra.service_roles, overrides={"max_in_flight": 2}
    )
    await stack.start(executors=2)
    try:
        replies = [
            await stack.client.submit({"tokens": [f"r{i}", "."], "token_delay_ms": 20})
            for i in range(12)
        ]
        results = await asyncio.gather(*(collect(stack.client, r.run.run_id) for r in replies))
        for i, (frames, transcript) in enumerate(results):
            assert_well_formed(frames)
            assert transcript.text == f"r{i}."
        assert await _max_overlap(stack) <= 2
    finally:
        await stack.close()


async def _max_overlap(stack: InProcessStack) -> int:
    """The most attempts that were running at one moment, from the run_events log."""
    return max_running(await stack.store.timeline())
