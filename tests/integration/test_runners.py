"""Runners a user registers: input checked at submit, jobs only for executors that have
the runner, a per-runner cap over all executors, runners in the health replies."""

import os
import subprocess
import sys

import pytest

from runwire import ClientError
from runwire.contracts.errors import ErrorCode
from runwire.contracts.status import RunStatus
from runwire.testing.servers import Servers
from runwire.testing.waiting import eventually
from tests.runners import SLOW_MOST, echo, slow
from tests.services import InProcessStack, collect

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


async def _claimed_by(stack: InProcessStack) -> dict[str, set[str]]:
    """Run id → the executors that claimed it."""
    claims: dict[str, set[str]] = {}
    for event in await stack.store.timeline():
        if event["event"] == "claimed":
            claims.setdefault(event["run_id"], set()).add(event["actor"])
    return claims


async def test_a_declared_runner_runs_and_its_input_is_checked_at_submit(
    infra: Servers, db_url: str, prefix: str
) -> None:
    async with InProcessStack(
        infra.nats_url, db_url, prefix, db_roles=infra.service_roles, runners={"echo": echo}
    ) as stack:
        reply = await stack.client.submit({"text": "hi ", "times": 3}, runner="echo")
        _, transcript = await collect(stack.client, reply.run.run_id)
        run = await stack.client.get(reply.run.run_id)

        with pytest.raises(ClientError) as bad:
            await stack.client.submit({"times": 2}, runner="echo")
        with pytest.raises(ClientError) as unknown:
            await stack.client.submit({"text": "x"}, runner="nobody")

    assert transcript.text == "hi hi hi "
    assert (run.status, run.result) == (RunStatus.FINISHED, {"text": "hi hi hi ", "echoed": 3})
    assert (bad.value.code, bad.value.retryable) == (ErrorCode.INVALID_REQUEST, False)
    assert "echo" in bad.value.message
    assert "text" in bad.value.message
    assert (unknown.value.code, unknown.value.retryable) == (ErrorCode.INVALID_REQUEST, False)
    assert "unknown runner 'nobody'" in unknown.value.message
    assert "echo" in unknown.value.message
    assert "scripted" in unknown.value.message


async def test_only_executors_that_have_a_runner_take_its_runs(
    infra: Servers, db_url: str, prefix: str
) -> None:
    # The submitter does not have `echo`: it learns it, with its input schema, from the
    # executor that serves it. Beside that executor runs one that lacks it.
    async with InProcessStack(
        infra.nats_url, db_url, prefix, db_roles=infra.service_roles, executors=0
    ) as stack:
        stack.start_executor("without-echo")
        stack.start_executor("with-echo", runners={"echo": echo})

        async def echo_accepted() -> str:
            try:
                return (await stack.client.submit({"text": "a"}, runner="echo")).run.run_id
            except ClientError as exc:
                if "unknown runner" not in exc.message:
                    raise
                raise AssertionError("echo not known yet") from exc

        first = await eventually(echo_accepted, timeout=15)
        echoes = [first] + [
            (await stack.client.submit({"text": f"{i}", "times": 2}, runner="echo")).run.run_id
            for i in range(11)
        ]
        scripted = [(await stack.client.submit({"tokens": ["s"]})).run.run_id for _ in range(12)]
        with pytest.raises(ClientError) as bad:
            await stack.client.submit({"text": ""}, runner="echo")
        for run_id in echoes + scripted:
            await collect(stack.client, run_id)
        runs = {run_id: await stack.client.get(run_id) for run_id in echoes + scripted}
        claims = await _claimed_by(stack)

    assert {r.status for r in runs.values()} == {RunStatus.FINISHED}
    assert all(runs[r].attempts == 1 for r in echoes)
    assert all(claims[r] == {"with-echo"} for r in echoes), claims
    # The other executor does take the runs of a runner it has.
    assert {actor for r in scripted for actor in claims[r]} == {"without-echo", "with-echo"}
    # The input is checked against the schema the executor recorded.
    assert bad.value.code == ErrorCode.INVALID_REQUEST
    assert "text" in bad.value.message


async def test_a_runners_max_in_flight_holds_over_every_executor(
    infra: Servers, db_url: str, prefix: str
) -> None:
    SLOW_MOST[0] = 0
    runners = {"slow": slow}
    async with InProcessStack(
        infra.nats_url, db_url, prefix, runners=runners, executors=2
    ) as stack:
        run_ids = [
            (await stack.client.submit({"ms": 250}, runner="slow")).run.run_id for _ in range(8)
        ]
        for run_id in run_ids:
            await collect(stack.client, run_id)
        claims = await _claimed_by(stack)

    assert SLOW_MOST[0] == 2
    assert len({actor for r in run_ids for actor in claims[r]}) == 2  # both executors took some


async def test_executors_and_the_submitter_report_their_runners(
    infra: Servers, db_url: str, prefix: str
) -> None:
    async with InProcessStack(
        infra.nats_url, db_url, prefix, db_roles=infra.service_roles, executors=0
    ) as stack:
        stack.start_executor("e-1", runners={"echo": echo})
        stack.start_executor("e-2", runners={"slow": slow})

        async def both() -> list[list[str]]:
            replies = await stack.client.health("executor")
            ready = len(replies) == 2 and all(r.runners for r in replies)
            return sorted(r.runners for r in replies) if ready else []

        executors = await eventually(both, timeout=15)
        # The submitter accepts what the executors serve (read again when a run names a
        # runner it does not know yet).
        await stack.client.submit({"ms": 1}, runner="slow")
        (submitter,) = await stack.client.health("submitter")

    assert executors == [
        ["echo", "effect", "openai", "scripted", "signal"],
        ["effect", "openai", "scripted", "signal", "slow"],
    ]
    assert submitter.runners == ["echo", "effect", "openai", "scripted", "signal", "slow"]


async def test_a_runner_named_in_the_setting_is_registered(
    infra: Servers, db_url: str, prefix: str
) -> None:
    overrides = {"runners": "echo=tests.runners:echo"}
    async with InProcessStack(
        infra.nats_url, db_url, prefix, db_roles=infra.service_roles, overrides=overrides
    ) as stack:
        reply = await stack.client.submit({"text": "set"}, runner="echo")
        _, transcript = await collect(stack.client, reply.run.run_id)
    assert transcript.text == "set"


@pytest.mark.parametrize(
    ("setting", "reason"),
    [
        ("echo=tests.runners:NOT_A_RUNNER", "is str, not a runner"),
        ("echo=tests.nowhere:echo", "cannot load 'tests.nowhere:echo'"),
        ("echo tests.runners:echo", "expected name=package.module:object"),
        ("Echo=tests.runners:echo", "is not a runner name"),
    ],
)
@pytest.mark.parametrize("service", ["executor", "submitter"])
def test_a_runner_that_cannot_be_registered_stops_the_service_with_the_reason(
    service: str, setting: str, reason: str
) -> None:
    env = {
        **os.environ,
        "RUNWIRE_RUNNERS": setting,
        "RUNWIRE_LOG_FORMAT": "text",
        # Never reached: the runners are loaded before NATS and Postgres are.
        "RUNWIRE_NATS_URL": "nats://127.0.0.1:1",
        "RUNWIRE_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none",
    }
    done = subprocess.run(
        [sys.executable, "-m", f"runwire.{service}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert reason in done.stderr
    assert "Traceback" not in done.stderr
