"""Sessions: the `multitask` rules (interrupt, enqueue, reject) and abort_session.

Runs that share a `session_id` never overlap (except a canceled run past its grace),
start in the order they were accepted, and a recovering run still holds its session.
"""

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from runwire.client import Client, ClientError
from runwire.contracts.errors import ErrorCode
from runwire.contracts.status import RunStatus
from runwire.runtime.settings import SubmitterSettings
from runwire.runtime.store import Run
from runwire.submitter.main import serve as serve_submitter
from runwire.testing.servers import Servers
from runwire.testing.waiting import eventually
from tests.services import InProcessStack, assert_well_formed, collect, max_running

pytestmark = pytest.mark.integration

SESSION = "chat-1"
SUPERSEDED_DONE = {"status": "canceled", "code": "SUPERSEDED"}
CANCELED_DONE = {"status": "canceled", "code": "CANCELED"}


def _long(tag: str, n: int = 200, delay_ms: int = 30) -> dict[str, Any]:
    """A reply that streams for n * delay_ms: long enough to be interrupted."""
    return {"tokens": [f"{tag}{i} " for i in range(n)], "token_delay_ms": delay_ms}


def _short(tag: str, n: int = 3, delay_ms: int = 10) -> dict[str, Any]:
    return {"tokens": [f"{tag}{i} " for i in range(n)], "token_delay_ms": delay_ms}


def _text(script: dict[str, Any]) -> str:
    return "".join(script["tokens"])


async def _row(stack: InProcessStack, run_id: str) -> Run:
    run = await stack.store.get_run_by_id(run_id)
    assert run is not None
    return run


async def _streaming(stack: InProcessStack, run_id: str, frames: int = 3) -> Run:
    """The run is running and its first frames reached the relay."""
    run = await _row(stack, run_id)
    assert run.status == RunStatus.RUNNING
    assert run.last_seq >= frames
    return run


async def _session_timeline(stack: InProcessStack, ids: list[str]) -> list[dict[str, Any]]:
    return [e for e in await stack.store.timeline() if e["run_id"] in ids]


def _one_after_another(runs: list[Run]) -> None:
    """Each run started after the one before it ended: no overlap, in this order."""
    for before, after in itertools.pairwise(runs):
        assert before.ended_at is not None
        assert after.started_at is not None
        assert before.ended_at <= after.started_at, (before.run_id, after.run_id)


@pytest.fixture
async def no_executor(infra: Servers, db_url: str, prefix: str) -> AsyncIterator[InProcessStack]:
    """The services without an executor: a test claims runs itself, as a dying executor."""
    async with InProcessStack(
        infra.nats_url, db_url, prefix, overrides={"supersede_grace_ms": 1000}, executors=0
    ) as stack:
        yield stack


# -- interrupt ---------------------------------------------------------------------------


async def test_interrupt_supersedes_the_active_run_then_starts(stack: InProcessStack) -> None:
    first = await stack.client.submit(_long("a"), session_id=SESSION)
    await eventually(lambda: _streaming(stack, first.run.run_id))

    second_script = _short("b")
    second = await stack.client.submit(second_script, session_id=SESSION)  # interrupt: default

    old_frames, old_text = await collect(stack.client, first.run.run_id)
    new_frames, new_text = await collect(stack.client, second.run.run_id)

    assert old_frames[-1].data == SUPERSEDED_DONE
    assert 0 < len(old_text.text) < len(_text(_long("a")))
    old = await stack.client.get(first.run.run_id)
    assert old.status == RunStatus.CANCELED
    assert old.error is not None
    assert (old.error.code, old.error.retryable) == (ErrorCode.SUPERSEDED, False)
    assert_well_formed(new_frames)
    assert new_text.text == _text(second_script)
    new = await stack.client.get(second.run.run_id)
    assert (new.status, new.attempts) == (RunStatus.FINISHED, 1)
    # The new run waited for the superseded attempt to wind down.
    _one_after_another([await _row(stack, first.run.run_id), await _row(stack, new.run_id)])


async def test_interrupt_also_cancels_the_runs_queued_behind(stack: InProcessStack) -> None:
    active = await stack.client.submit(_long("a"), session_id=SESSION)
    await eventually(lambda: _streaming(stack, active.run.run_id))
    queued = await stack.client.submit(_short("q"), session_id=SESSION, multitask="enqueue")
    assert queued.run.status == RunStatus.QUEUED

    latest = await stack.client.submit(_short("n"), session_id=SESSION)

    frames, transcript = await collect(stack.client, queued.run.run_id)
    assert [f.data for f in frames] == [SUPERSEDED_DONE]
    assert transcript.text == ""
    skipped = await stack.client.get(queued.run.run_id)
    assert (skipped.status, skipped.attempts, skipped.started_at) == (RunStatus.CANCELED, 0, None)
    assert skipped.error is not None
    assert skipped.error.code == ErrorCode.SUPERSEDED
    old_frames, _ = await collect(stack.client, active.run.run_id)
    assert old_frames[-1].data == SUPERSEDED_DONE
    _, text = await collect(stack.client, latest.run.run_id)
    assert text.text == _text(_short("n"))


async def test_interrupt_waits_at_most_the_grace_for_a_run_that_does_not_stop(
    no_executor: InProcessStack,
) -> None:
    stack = no_executor  # supersede grace: 1 s
    stuck = await stack.client.submit(_long("a"), session_id=SESSION)
    # An executor that holds the run for 6 s and never hears the cancel.
    await eventually(lambda: stack.store.claim(stuck.run.run_id, 0, "deaf", 6000))
    stack.start_executor()

    asked = time.monotonic()
    fresh = await stack.client.submit(_short("b"), session_id=SESSION)
    _, transcript = await collect(stack.client, fresh.run.run_id)

    assert transcript.text == _text(_short("b"))
    waited = time.monotonic() - asked
    assert 0.9 < waited < 5, waited
    started = await _row(stack, fresh.run.run_id)
    still = await _row(stack, stuck.run.run_id)
    assert started.started_at is not None
    assert still.ended_at is None or still.ended_at > started.started_at
    # The deaf executor's lease runs out: the run is closed as superseded, never resumed.
    frames, _ = await collect(stack.client, stuck.run.run_id)
    assert frames[-1].data == SUPERSEDED_DONE
    closed = await stack.client.get(stuck.run.run_id)
    assert (closed.status, closed.attempts) == (RunStatus.CANCELED, 1)


async def test_interrupt_while_the_active_run_is_recovering(no_executor: InProcessStack) -> None:
    stack = no_executor
    lost = await stack.client.submit(_long("a"), session_id=SESSION)
    # Its executor dies at once: a 200 ms lease nobody renews.
    await eventually(lambda: stack.store.claim(lost.run.run_id, 0, "ghost", 200))
    await eventually(lambda: _status(stack, lost.run.run_id, RunStatus.RECOVERING))

    fresh = await stack.client.submit(_short("b"), session_id=SESSION)

    # A recovering run has no attempt to wind down: it is canceled at once.
    superseded = await stack.client.get(lost.run.run_id)
    assert superseded.status == RunStatus.CANCELED
    stack.start_executor()
    _, transcript = await collect(stack.client, fresh.run.run_id)
    assert transcript.text == _text(_short("b"))
    frames, _ = await collect(stack.client, lost.run.run_id)
    assert frames[-1].data == SUPERSEDED_DONE
    final = await stack.client.get(lost.run.run_id)
    assert (final.status, final.attempts) == (RunStatus.CANCELED, 1)  # never resumed


async def test_two_simultaneous_interrupts_leave_one_survivor(stack: InProcessStack) -> None:
    active = await stack.client.submit(_long("a"), session_id=SESSION)
    await eventually(lambda: _streaming(stack, active.run.run_id))
    other = await Client.connect(stack.nats_url, prefix=stack.prefix)
    try:
        replies = await asyncio.gather(
            stack.client.submit(_long("b", 20, 10), session_id=SESSION),
            other.submit(_long("c", 20, 10), session_id=SESSION),
        )
    finally:
        await other.close()
    ids = [active.run.run_id] + [r.run.run_id for r in replies]

    for run_id in ids:
        await collect(stack.client, run_id)
    runs = [await stack.client.get(run_id) for run_id in ids]

    statuses = sorted(r.status for r in runs)
    assert statuses == sorted([RunStatus.FINISHED, RunStatus.CANCELED, RunStatus.CANCELED])
    for run in runs:
        if run.status == RunStatus.CANCELED:
            assert run.error is not None
            assert run.error.code == ErrorCode.SUPERSEDED
    # The survivor is the one accepted last, and no two runs of the session overlapped.
    rows = sorted([await _row(stack, i) for i in ids], key=lambda r: r.submit_seq)
    assert rows[-1].status == RunStatus.FINISHED
    assert max_running(await _session_timeline(stack, ids)) == 1


# -- enqueue -----------------------------------------------------------------------------


async def test_enqueued_runs_start_in_order_one_at_a_time(stack: InProcessStack) -> None:
    scripts = [_long("a", 20, 10), _short("b"), _short("c")]
    ids = [
        (await stack.client.submit(s, session_id=SESSION, multitask="enqueue")).run.run_id
        for s in scripts
    ]

    for run_id, script in zip(ids, scripts, strict=True):
        frames, transcript = await collect(stack.client, run_id)
        assert_well_formed(frames)
        assert transcript.text == _text(script)
    rows = [await _row(stack, i) for i in ids]
    assert [r.status for r in rows] == [RunStatus.FINISHED] * 3
    _one_after_another(rows)


async def test_a_run_of_another_session_is_not_held_back(stack: InProcessStack) -> None:
    long = await stack.client.submit(_long("a"), session_id=SESSION, multitask="enqueue")
    behind = await stack.client.submit(_short("b"), session_id=SESSION, multitask="enqueue")
    elsewhere = await stack.client.submit(_short("x"), session_id="chat-2", multitask="enqueue")

    _, transcript = await collect(stack.client, elsewhere.run.run_id)

    assert transcript.text == _text(_short("x"))
    assert (await stack.client.get(long.run.run_id)).status == RunStatus.RUNNING
    assert (await stack.client.get(behind.run.run_id)).status == RunStatus.QUEUED
    await stack.client.cancel(long.run.run_id)
    _, transcript = await collect(stack.client, behind.run.run_id)
    assert transcript.text == _text(_short("b"))


@pytest.fixture
async def wide(infra: Servers, db_url: str, prefix: str) -> AsyncIterator[InProcessStack]:
    """Two executors of two slots each and two submitters."""
    stack = InProcessStack(
        infra.nats_url, db_url, prefix, db_roles=infra.service_roles, overrides={"max_in_flight": 2}
    )
    await stack.start(executors=2)
    # A second submitter replica in the same queue group: submits are split between them.
    stack._start("submitter-2", serve_submitter, stack.settings(SubmitterSettings))
    try:
        yield stack
    finally:
        await stack.close()


async def test_twenty_concurrent_enqueue_submits_run_strictly_in_order(
    wide: InProcessStack,
) -> None:
    stack = wide
    clients = [await Client.connect(stack.nats_url, prefix=stack.prefix) for _ in range(4)]
    try:
        replies = await asyncio.gather(
            *(
                clients[i % 4].submit(
                    _short(f"m{i}-", 2, 15), session_id=SESSION, multitask="enqueue"
                )
                for i in range(20)
            )
        )
    finally:
        for client in clients:
            await client.close()
    ids = [r.run.run_id for r in replies]

    rows = await eventually(lambda: _all_ended(stack, ids), timeout=60)

    assert {r.status for r in rows} == {RunStatus.FINISHED}
    assert {r.attempts for r in rows} == {1}
    # Submission order is the order the submitters accepted the runs (under the lock).
    accepted = sorted(rows, key=lambda r: r.submit_seq)
    _one_after_another(accepted)
    timeline = await _session_timeline(stack, ids)
    submitted = [e["run_id"] for e in timeline if e["event"] == "submitted"]
    claimed = [e["run_id"] for e in timeline if e["event"] == "claimed"]
    assert submitted == [r.run_id for r in accepted]
    assert claimed == submitted
    assert max_running(timeline) == 1
    for i, run_id in enumerate(ids):
        assert (await _row(stack, run_id)).result == {"text": _text(_short(f"m{i}-", 2, 15))}


async def _all_ended(stack: InProcessStack, ids: list[str]) -> list[Run]:
    rows = [await _row(stack, i) for i in ids]
    assert all(r.status.terminal for r in rows), [r.status for r in rows]
    return rows


async def test_a_session_queue_takes_no_executor_slot(wide: InProcessStack) -> None:
    stack = wide  # four slots in all
    head = await stack.client.submit(_long("a", 400), session_id=SESSION, multitask="enqueue")
    for i in range(8):
        await stack.client.submit(_short(f"q{i}"), session_id=SESSION, multitask="enqueue")
    await eventually(lambda: _streaming(stack, head.run.run_id))

    others = [await stack.client.submit(_short(f"x{i}")) for i in range(4)]
    for i, reply in enumerate(others):
        _, transcript = await collect(stack.client, reply.run.run_id, timeout=10)
        assert transcript.text == _text(_short(f"x{i}"))

    # Runs without a session went through while the head still streams.
    assert (await stack.client.get(head.run.run_id)).status == RunStatus.RUNNING
    await stack.client.abort_session(SESSION)


async def test_a_recovering_run_holds_its_session(no_executor: InProcessStack) -> None:
    stack = no_executor
    lost = await stack.client.submit(_short("a", 5), session_id=SESSION)
    await eventually(lambda: stack.store.claim(lost.run.run_id, 0, "ghost", 200))
    await eventually(lambda: _status(stack, lost.run.run_id, RunStatus.RECOVERING))
    behind = await stack.client.submit(_short("b"), session_id=SESSION, multitask="enqueue")

    stack.start_executor()
    _, first = await collect(stack.client, lost.run.run_id)
    _, second = await collect(stack.client, behind.run.run_id)

    assert first.text == _text(_short("a", 5))
    assert second.text == _text(_short("b"))
    rows = [await _row(stack, lost.run.run_id), await _row(stack, behind.run.run_id)]
    assert [r.attempts for r in rows] == [2, 1]
    _one_after_another(rows)


# -- reject ------------------------------------------------------------------------------


async def test_reject_answers_session_busy_and_creates_nothing(stack: InProcessStack) -> None:
    active = await stack.client.submit(_short("a", 20, 20), session_id=SESSION)
    await eventually(lambda: _streaming(stack, active.run.run_id))

    with pytest.raises(ClientError) as refused:
        await stack.client.submit(
            _short("b"), session_id=SESSION, multitask="reject", request_id="rejected-1"
        )

    assert refused.value.code == ErrorCode.SESSION_BUSY
    assert refused.value.retryable is False
    assert await stack.store.run_by_request("default", "rejected-1") is None
    assert {e["run_id"] for e in await stack.store.timeline()} == {active.run.run_id}
    _, text = await collect(stack.client, active.run.run_id)
    assert text.text == _text(_short("a", 20, 20))  # the active run went on untouched
    # Once the session is idle, the same request is accepted.
    accepted = await stack.client.submit(
        _short("b"), session_id=SESSION, multitask="reject", request_id="rejected-1"
    )
    _, text = await collect(stack.client, accepted.run.run_id)
    assert text.text == _text(_short("b"))


# -- abort_session -----------------------------------------------------------------------


async def test_abort_session_cancels_the_active_run_and_its_queue(stack: InProcessStack) -> None:
    active = await stack.client.submit(_long("a"), session_id=SESSION)
    await eventually(lambda: _streaming(stack, active.run.run_id))
    queued = [
        (await stack.client.submit(_short(t), session_id=SESSION, multitask="enqueue")).run.run_id
        for t in ("b", "c")
    ]

    canceled = await stack.client.abort_session(SESSION)

    assert canceled == [active.run.run_id, *queued]
    frames, _ = await collect(stack.client, active.run.run_id)
    assert frames[-1].data == CANCELED_DONE
    for run_id in queued:
        frames, _ = await collect(stack.client, run_id)
        assert [f.data for f in frames] == [CANCELED_DONE]
        run = await stack.client.get(run_id)
        assert (run.status, run.attempts, run.started_at) == (RunStatus.CANCELED, 0, None)
    assert (await stack.client.get(active.run.run_id)).status == RunStatus.CANCELED
    assert await stack.client.abort_session(SESSION) == []
    # The session takes new runs afterwards.
    after = await stack.client.submit(_short("d"), session_id=SESSION, multitask="enqueue")
    _, text = await collect(stack.client, after.run.run_id)
    assert text.text == _text(_short("d"))


async def _status(stack: InProcessStack, run_id: str, status: RunStatus) -> bool:
    return (await _row(stack, run_id)).status == status
