"""A service killed between a commit and the publish of what it implies loses nothing:
the outbox sweep publishes each message once afterwards, and nothing else repairs it.

Each test arms a named fault point in one real service process, which then kills itself
with SIGKILL right there. A core-NATS subscription on the message's subject sees every
publish (JetStream's de-duplication only keeps the stream from storing a repeat), and
the stream shows what was stored.
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.msg import Msg

from runwire.client import ClientError
from runwire.contracts.events import RunEvent
from runwire.contracts.frames import Frame, FrameType
from runwire.contracts.status import RunStatus
from runwire.runtime.faults import OUTBOX_COMMITTED, OUTBOX_SWEPT
from runwire.testing.waiting import eventually
from tests.services import ProcessStack, assert_well_formed, collect

pytestmark = pytest.mark.chaos

TOKENS = ["one ", "two ", "three"]
# Long enough that recovery's look for lost jobs cannot be what publishes a job here.
NO_LOST_JOB_LOOK = {"republish_after_ms": 600_000}


class Seen:
    """Every message published on a subject, as a core-NATS subscriber receives it."""

    def __init__(self) -> None:
        self.messages: list[Msg] = []

    async def add(self, msg: Msg) -> None:
        self.messages.append(msg)


@pytest.fixture
async def stack(service_env: dict[str, str], tmp_path: Path) -> AsyncIterator[ProcessStack]:
    """A process stack whose services each test starts itself."""
    procs = ProcessStack(service_env, tmp_path)
    try:
        yield procs
    finally:
        await procs.close()


def _killed_itself(stack: ProcessStack, name: str) -> bool:
    proc = stack.procs[name].proc
    assert proc is not None
    return proc.poll() == -signal.SIGKILL


async def _stored(stack: ProcessStack, stream: str, subject: str) -> int:
    info = await stack.client.nc.jetstream().stream_info(stream, subjects_filter=subject)
    return sum((info.state.subjects or {}).values())


async def test_a_job_committed_by_a_submitter_killed_before_publishing_is_swept_once(
    stack: ProcessStack,
) -> None:
    stack.start("submitter", fault_points=f"{OUTBOX_COMMITTED}=kill")
    stack.start("relay")
    stack.start("recovery", **NO_LOST_JOB_LOOK)
    await stack.open()
    jobs = Seen()
    await stack.client.nc.subscribe(stack.client.subjects.jobs_wildcard, cb=jobs.add)
    request_id = str(uuid.uuid4())

    with pytest.raises(ClientError):  # the submitter died before it could answer
        await stack.client.submit({"tokens": TOKENS}, request_id=request_id)
    assert _killed_itself(stack, "submitter")
    run = await stack.store.run_by_request(stack.client.tenant, request_id)
    assert run is not None  # committed, with its job in the outbox
    assert run.status == RunStatus.QUEUED

    await eventually(lambda: len(jobs.messages) == 1, timeout=10)  # the sweep's publish
    stack.start("executor")
    frames, transcript = await collect(stack.client, run.run_id)

    assert transcript.text == "".join(TOKENS)
    assert_well_formed(frames)
    final = await stack.store.get_run_by_id(run.run_id)
    assert final is not None
    assert (final.status, final.attempts) == (RunStatus.FINISHED, 1)
    assert len(jobs.messages) == 1  # published once, by the sweep alone
    info = await stack.client.nc.jetstream().stream_info(stack.client.subjects.jobs_stream)
    assert info.state.last_seq == 1  # one job ever stored


async def test_closing_frames_of_an_executor_killed_after_its_commit_are_swept_once(
    stack: ProcessStack,
) -> None:
    for name in ("submitter", "relay"):
        stack.start(name)
    stack.start("recovery", **NO_LOST_JOB_LOOK)
    await stack.open()
    stack.start("executor", fault_points=f"{OUTBOX_COMMITTED}=kill")
    raw = Seen()
    subjects = stack.client.subjects

    run_id = (await stack.client.submit({"tokens": TOKENS})).run.run_id
    await stack.client.nc.subscribe(subjects.frames_out(stack.client.tenant, run_id), cb=raw.add)
    # The executor commits `finished` (with its `done` frame in the outbox) and dies.
    await eventually(lambda: _killed_itself(stack, "executor"), timeout=20)
    frames, transcript = await collect(stack.client, run_id)

    assert transcript.text == "".join(TOKENS)
    assert_well_formed(frames)
    assert frames[-1].data == {"status": "finished"}
    done = [m for m in raw.messages if Frame.model_validate_json(m.data).type == FrameType.DONE]
    assert len(done) == 1  # published once, by the sweep (the executor never did)
    stored = await _stored(
        stack, subjects.run_frames_stream, subjects.run_frames(stack.client.tenant, run_id)
    )
    assert stored == len(frames)  # each frame once on the client subject


async def test_run_events_published_by_a_sweep_killed_before_recording_them_are_stored_once(
    stack: ProcessStack,
) -> None:
    for name in ("submitter", "relay"):
        stack.start(name)
    stack.start("recovery-a", fault_points=f"{OUTBOX_SWEPT}=kill", **NO_LOST_JOB_LOOK)
    await stack.open()
    events = Seen()
    await stack.client.nc.subscribe(stack.client.subjects.events_wildcard, cb=events.add)

    run_id = (await stack.client.submit({"tokens": TOKENS})).run.run_id
    # Recovery publishes the run's `submitted` event, then dies before deleting its row.
    await eventually(lambda: _killed_itself(stack, "recovery-a"), timeout=20)
    assert [RunEvent.model_validate_json(m.data).event for m in events.messages] == ["submitted"]
    stack.start("recovery-b", kind="recovery", **NO_LOST_JOB_LOOK)
    stack.start("executor")
    await collect(stack.client, run_id)

    expected = ["submitted", "claimed", "finished"]
    subject = stack.client.subjects.events(stack.client.tenant, run_id)

    async def stored_once() -> bool:
        return await _stored(stack, stack.client.subjects.events_stream, subject) == 3

    await eventually(stored_once, timeout=10)
    seen = [RunEvent.model_validate_json(m.data).event for m in events.messages]
    assert seen == ["submitted", *expected]  # `submitted` published twice, stored once
    js = stack.client.nc.jetstream()
    sub = await js.subscribe(subject, ordered_consumer=True)
    try:
        kept = [RunEvent.model_validate_json((await sub.next_msg(5)).data) for _ in expected]
    finally:
        await sub.unsubscribe()
    assert [e.event for e in kept] == expected
