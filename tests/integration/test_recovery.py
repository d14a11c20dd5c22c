"""The recovery service against real servers: expired leases, progress, interruption.

An executor that vanished is played by claiming runs directly in Postgres and never
renewing their lease: exactly what a kill -9 leaves behind.
"""

import asyncio

import pytest

from runwire.contracts.errors import ErrorBody, ErrorCode
from runwire.contracts.frames import FrameType
from runwire.contracts.status import RunStatus
from runwire.contracts.subjects import Subjects
from runwire.recovery.leases import ExpiredLeases, PresenceWatch
from runwire.runtime.broker import Broker
from runwire.runtime.outbox import Outbox
from runwire.runtime.settings import RecoverySettings
from runwire.runtime.store import Run
from runwire.testing.servers import Servers
from runwire.testing.waiting import eventually, fault_window
from tests.services import InProcessStack, collect

pytestmark = pytest.mark.integration


@pytest.fixture
async def no_executor(infra: Servers, db_url: str, prefix: str):  # type: ignore[no-untyped-def]
    stack = InProcessStack(
        infra.nats_url,
        db_url,
        prefix,
        db_roles=infra.service_roles,
        overrides={"max_recoveries": 2},
    )
    await stack.start(executors=0)
    try:
        yield stack
    finally:
        await stack.close()


async def _vanishing_claim(stack: InProcessStack, run_id: str, generation: int) -> Run:
    """Claim as an executor that dies at once: a lease of 200 ms nobody renews."""
    run = await eventually(lambda: stack.store.claim(run_id, generation, "ghost", 200))
    assert run.status == RunStatus.RUNNING
    return run


async def _recovering(stack: InProcessStack, run_id: str) -> Run:
    run = await stack.store.get_run_by_id(run_id)
    assert run is not None
    assert run.status == RunStatus.RECOVERING
    return run


async def test_runs_without_progress_are_interrupted_after_max_recoveries(
    no_executor: InProcessStack,
) -> None:
    stack = no_executor
    reply = await stack.client.submit({"tokens": ["never", "finishes"]})
    run_id = reply.run.run_id

    generation = 0
    for _ in range(2):  # two recoveries are allowed without progress
        claimed = await _vanishing_claim(stack, run_id, generation)
        recovered = await eventually(lambda: _recovering(stack, run_id))
        generation = claimed.generation
        assert recovered.generation == generation
    await _vanishing_claim(stack, run_id, generation)  # and a third death

    frames, _ = await collect(stack.client, run_id)

    run = await stack.client.get(run_id)
    assert run.status == RunStatus.INTERRUPTED
    assert run.error is not None
    assert run.error.code == ErrorCode.INTERRUPTED
    assert run.error.retryable is True
    error, done = frames[-2], frames[-1]
    assert error.type == FrameType.ERROR
    assert error.data["code"] == "INTERRUPTED"
    assert "may be retried" in error.data["message"]
    assert done.data == {"status": "interrupted", "code": "INTERRUPTED"}


async def test_checkpoint_progress_resets_the_count(no_executor: InProcessStack) -> None:
    stack = no_executor
    reply = await stack.client.submit({"tokens": ["a"]})
    run_id = reply.run.run_id

    generation = 0
    for step in range(4):  # more deaths than max_recoveries, each after progress
        claimed = await _vanishing_claim(stack, run_id, generation)
        await stack.store.save_checkpoint(run_id, claimed.generation, {"step": step}, "")
        await eventually(lambda: _recovering(stack, run_id))
        generation = claimed.generation

    run = await stack.store.get_run_by_id(run_id)
    assert run is not None
    assert run.status == RunStatus.RECOVERING
    assert run.checkpoint == {"step": 3}

    # A real executor now resumes it and receives the checkpoint.
    stack.start_executor()
    frames, transcript = await collect(stack.client, run_id)
    assert transcript.text == "a"
    assert frames[-1].data == {"status": "finished"}


async def test_a_canceled_run_whose_executor_died_is_closed_as_canceled(
    no_executor: InProcessStack,
) -> None:
    stack = no_executor
    reply = await stack.client.submit({"tokens": ["x"]})
    run_id = reply.run.run_id
    await _vanishing_claim(stack, run_id, 0)

    canceled = await stack.client.cancel(run_id)
    assert canceled.status == RunStatus.RUNNING  # the executor is asked; it never answers

    frames, _ = await collect(stack.client, run_id)
    assert frames[-1].data == {"status": "canceled", "code": "CANCELED"}
    run = await stack.client.get(run_id)
    assert run.status == RunStatus.CANCELED
    assert run.error == ErrorBody(
        code=ErrorCode.CANCELED, message="canceled by request", retryable=False
    )


async def test_two_recovery_replicas_act_once_on_each_run(no_executor: InProcessStack) -> None:
    stack = no_executor
    stack.start_recovery("recovery-2")  # a second recovery service on the same database
    ids = [(await stack.client.submit({"tokens": ["t"]})).run.run_id for _ in range(10)]
    for run_id in ids:
        await _vanishing_claim(stack, run_id, 0)
    for run_id in ids:
        await eventually(lambda run_id=run_id: _recovering(stack, run_id), timeout=15)

    timeline = await stack.store.timeline()
    recovered = [e["run_id"] for e in timeline if e["event"] == "recovering"]
    assert sorted(recovered) == sorted(ids)  # each death recovered exactly once


@pytest.mark.parametrize("ending", ["retry", "shutdown"])
async def test_a_cancel_that_lands_while_an_attempt_ends_closes_the_run(
    no_executor: InProcessStack, ending: str
) -> None:
    stack = no_executor
    reply = await stack.client.submit({"tokens": ["x"]})
    run_id = reply.run.run_id
    claimed = await _vanishing_claim(stack, run_id, 0)
    await stack.client.cancel(run_id)  # the run is still running: only flagged

    # The attempt ends right after (it had failed, or its executor is shutting down).
    error = ErrorBody(code=ErrorCode.RUNNER_ERROR, message="boom", retryable=True)
    if ending == "retry":
        ended = await stack.store.requeue(run_id, claimed.generation, error, "", 10, "test", 1)
    else:
        ended = await stack.store.hand_back(run_id, claimed.generation, "", "test", 1)

    assert ended.status == RunStatus.CANCELED
    assert ended.error is not None
    assert ended.error.code == ErrorCode.CANCELED
    # Its closing frames reach clients too: written with the transition, published by
    # the outbox sweep here (an executor would have published them right after).
    frames, _ = await collect(stack.client, run_id)
    assert frames[-1].data == {"status": "canceled", "code": "CANCELED"}


async def test_jobs_purged_from_the_stream_are_published_again(
    infra: Servers, db_url: str, prefix: str
) -> None:
    # Re-published within the stream's duplicate window, where a plain repeat of the
    # message id would be dropped as a duplicate.
    async with _queued_only(infra, db_url, prefix) as stack:
        ids = [(await stack.client.submit({"tokens": [f"p{i}"]})).run.run_id for i in range(3)]
        js = stack.client.nc.jetstream()
        await js.purge_stream(stack.client.subjects.jobs_stream)

        await _each_finishes(stack, ids, "p")


async def test_jobs_still_waiting_in_a_long_queue_are_not_copied(
    infra: Servers, db_url: str, prefix: str
) -> None:
    async with _queued_only(infra, db_url, prefix) as stack:  # the jobs wait in the stream
        ids = [(await stack.client.submit({"tokens": [f"w{i}"]})).run.run_id for i in range(5)]
        submitted = {r: (await stack.store.get_run_by_id(r)).created_at for r in ids}  # type: ignore[union-attr]

        async def all_looked_at_twice() -> bool:
            for run_id, created in submitted.items():
                run = await stack.store.get_run_by_id(run_id)
                assert run is not None
                if run.job_checked_at is None:
                    return False
                if (run.job_checked_at - created).total_seconds() < 0.6:
                    return False
            return True

        await eventually(all_looked_at_twice, timeout=15)
        js = stack.client.nc.jetstream()
        info = await js.stream_info(stack.client.subjects.jobs_stream)
        assert info.state.messages == len(ids)  # one job each, no copies

        await _each_finishes(stack, ids, "w")


def _queued_only(infra: Servers, db_url: str, prefix: str) -> InProcessStack:
    """A stack with no executor (jobs stay queued) and a short republish delay."""
    return InProcessStack(
        infra.nats_url, db_url, prefix, overrides={"republish_after_ms": 300}, executors=0
    )


async def _each_finishes(stack: InProcessStack, ids: list[str], token: str) -> None:
    """Once an executor starts, run i finishes with the text `<token><i>`, once."""
    stack.start_executor()
    for i, run_id in enumerate(ids):
        _, transcript = await collect(stack.client, run_id, timeout=20)
        assert transcript.text == f"{token}{i}"


async def test_the_lease_duty_asked_many_times_at_once_answers_each(
    no_executor: InProcessStack,
) -> None:
    """Recovery's tick and its lease watch may ask for expired leases at the same moment;
    the duty's presence check uses one connection of its own, so the asks take turns:
    each one answers (none fails on a connection already busy), and a run whose
    executor vanished is recovered once."""
    stack = no_executor
    reply = await stack.client.submit({"tokens": ["a"]})
    await _vanishing_claim(stack, reply.run.run_id, 0)
    settings = stack.settings(RecoverySettings, "recovery")
    broker = await Broker.connect(stack.nats_url, Subjects(stack.prefix), name="test-recovery")
    presence = PresenceWatch(settings.database_url, 0)
    duty = ExpiredLeases(settings, stack.store, broker, Outbox(stack.store, broker), presence)
    try:
        await duty.run()  # its presence session is open from now on
        await fault_window(0.3, "the claim's 200 ms lease expires")
        reports = await asyncio.gather(*(duty.run() for _ in range(8)))
    finally:
        await presence.close()
        await broker.close()
    # The service's own recovery may have been first; what matters: nothing failed, and
    # the run was taken over once at most by these asks.
    assert sum(r["recovering"] for r in reports) <= 1
    events = [e["event"] for e in await stack.store.run_events(reply.run.run_id)]
    assert events.count("recovering") == 1
