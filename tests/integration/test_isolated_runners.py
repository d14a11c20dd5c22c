"""Runners in a process of their own (`RUNWIRE_ISOLATED_RUNNERS`): the runner's process
has none of the executor's credentials, does everything through the executor (frames,
tools, effects, checkpoints, retries resumed), is stopped by a cancel, killed when it
does not listen, and a crash of it is an attempt's retryable failure whose message says
nothing of what the runner had in hand."""

import os

import pytest

from runwire.contracts.errors import ErrorCode
from runwire.contracts.frames import FrameType
from runwire.contracts.status import RunStatus
from runwire.testing.waiting import eventually
from tests.services import InProcessStack, collect

pytestmark = pytest.mark.integration

ISOLATED = pytest.mark.stack(
    runners="probe=tests.isolated:probe,waits=tests.isolated:waits,crashes=tests.isolated:crashes",
    tools="shout=tests.isolated:shout",
    isolated_runners="probe,waits,crashes",
    abort_grace_ms=500,
    retry_base_ms=10,
)


@ISOLATED
async def test_an_isolated_runner_does_everything_through_the_executor_and_sees_no_credentials(
    stack: InProcessStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What the executor's process holds, which the runner's must not see.
    monkeypatch.setenv("PGPASSWORD", "hunter2")
    monkeypatch.setenv("DATABASE_URL", "postgresql://runwire:hunter2@db/runwire")
    client = stack.client
    await client.set_policy(effects=["noop"])
    reply = await client.submit({"fail_first": True}, runner="probe", max_attempts=2)
    frames, transcript = await collect(client, reply.run.run_id)
    run = await client.get(reply.run.run_id)
    assert run.status == RunStatus.FINISHED, run.error
    result = run.result or {}
    # Another process, a child of the executor's (this test's process hosts it).
    assert result["pid"] != os.getpid()
    assert result["parent"] == os.getpid()
    assert result["seen"] == []
    # The first attempt streamed, called its tool (in its own process, the effect done
    # by the executor) and checkpointed; the second resumed from the checkpoint.
    assert transcript.text == "attempt 1 attempt 2 "
    assert result["resumed"] is True
    assert result["checkpoint"]["shouted"] == "HI"
    assert result["checkpoint"]["tool_pid"] not in (os.getpid(), result["pid"])
    tools = [f for f in frames if f.type == FrameType.TOOL_RESULT]
    assert [f.data["output"]["text"] for f in tools] == ["HI"]
    assert "id" in tools[0].data["output"]["receipt"]
    effects = [f.data["state"] for f in frames if f.type == FrameType.EFFECT]
    assert effects[-1] == "committed"


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped) counts as gone.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ", 1)[1][0] != "Z"


@ISOLATED
@pytest.mark.parametrize("deaf", [False, True])
async def test_a_cancel_stops_an_isolated_runner_and_one_that_does_not_listen_is_killed(
    stack: InProcessStack, deaf: bool
) -> None:
    client = stack.client
    reply = await client.submit({"deaf": deaf}, runner="waits")
    following = client.stream(reply.run.run_id)
    pid = None
    async for frame in following:
        if frame.type == FrameType.MESSAGE:
            pid = int(frame.data["text"])
            break
    await following.aclose()
    assert pid is not None
    assert _running(pid)
    await client.cancel(reply.run.run_id)
    await collect(client, reply.run.run_id)
    run = await client.get(reply.run.run_id)
    assert run.status == RunStatus.CANCELED
    await eventually(lambda: not _running(pid), timeout=20)


@ISOLATED
@pytest.mark.parametrize("how", ["exit", "raise"])
async def test_a_crash_of_an_isolated_runner_fails_its_attempt_and_says_no_secret(
    stack: InProcessStack, how: str
) -> None:
    client = stack.client
    reply = await client.submit({"how": how}, runner="crashes", max_attempts=2)
    _, transcript = await collect(client, reply.run.run_id)
    run = await client.get(reply.run.run_id)
    assert run.status == RunStatus.FAILED
    assert run.error is not None
    assert run.error.code == ErrorCode.RUNNER_ERROR
    assert transcript.text == "about to about to "  # retried: the failure was retryable
    expected = "exited (3)" if how == "exit" else "(ValueError)"
    assert expected in run.error.message
    assert "hunter2" not in run.error.message


@pytest.mark.stack(
    runners="asks=tests.waiting:asks", isolated_runners="asks", recovery_interval_ms=100
)
async def test_an_isolated_runner_waits_for_an_answer_and_goes_on_with_it(
    stack: InProcessStack,
) -> None:
    client = stack.client
    run_id = (await client.submit({}, runner="asks")).run.run_id

    async def waiting() -> bool:
        return (await client.get(run_id)).status == RunStatus.WAITING

    await eventually(waiting, timeout=20)
    await client.resume(run_id, {"say": "yes"})
    _, transcript = await collect(client, run_id)
    run = await client.get(run_id)
    assert run.status == RunStatus.FINISHED, run.error
    assert transcript.text == "hello you said yes"
