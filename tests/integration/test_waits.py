"""Runs that wait: a runner asks (`ctx.interrupt`) or waits for a signal
(`ctx.wait_for_signal`); its attempt ends and the run waits holding no worker; an
answer, a signal (even one sent before the wait) or the wait's timeout queues its next
attempt, which continues where the runner checkpointed, with no text repeated."""

import asyncio
import os
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import httpx
import pytest

from runwire import ClientError
from runwire.contracts.errors import ErrorCode
from runwire.contracts.frames import FrameType, WaitKind
from runwire.contracts.replies import RunSummary
from runwire.contracts.status import RunStatus
from runwire.runtime.metrics import QUEUE, WAIT_DURATION
from runwire.testing.waiting import eventually
from tests.gateway import serve_gateway
from tests.local_stack import ROOT, client_of, local_stack, stack_command
from tests.services import InProcessStack, collect

pytestmark = pytest.mark.integration

WAITING = pytest.mark.stack(
    runners=(
        "asks=tests.waiting:asks,collects=tests.waiting:collects,naps=tests.waiting:naps,"
        "expects=tests.waiting:expects"
    ),
    durable_sleep_s=0.5,
    max_in_flight=1,
    recovery_interval_ms=100,
)


async def _waiting(stack: InProcessStack, run_id: str, *, or_ended: bool = False) -> RunSummary:
    async def waits() -> RunSummary | None:
        run = await stack.client.get(run_id)
        ended = or_ended and run.status.terminal
        return run if run.status == RunStatus.WAITING or ended else None

    run = await eventually(waits, timeout=20)
    assert run is not None
    return run


@WAITING
async def test_a_run_that_asks_holds_no_worker_and_goes_on_with_the_answer(
    stack: InProcessStack,
) -> None:
    client = stack.client
    # One attempt of `asks` at a time (max_in_flight 1), one attempt allowed each: two
    # runs waiting at once hold nothing, and waiting costs no attempt.
    first = (await client.submit({}, runner="asks", max_attempts=1)).run.run_id
    second = (await client.submit({}, runner="asks", max_attempts=1)).run.run_id
    waiting = await _waiting(stack, first)
    await _waiting(stack, second)

    def counted() -> bool:  # as recovery measures them, in /metrics
        gauges = {family.name: family.samples for family in QUEUE.collect()}
        return [s.value for s in gauges["runwire_waiting_runs"]] == [2]

    await eventually(counted, timeout=10)
    assert waiting.waiting_for is not None
    assert waiting.waiting_for.kind == WaitKind.INTERRUPT
    assert waiting.waiting_for.payload == {"question": "may I?"}

    observed_before = _answered_waits()
    answered = await client.resume(first, {"say": "yes"}, request_id="answer-1")
    assert not answered.duplicate
    frames, transcript = await collect(client, first)
    run = await client.get(first)
    assert run.status == RunStatus.FINISHED, run.error
    assert run.result is not None
    assert run.result["answer"] == {"say": "yes"}
    assert run.result["attempt"] == 2
    assert transcript.text == "hello you said yes"  # greeted once, nothing repeated
    waits = [f.data for f in frames if f.type == FrameType.WAIT]
    assert [w["wait_id"] for w in waits] == [waiting.waiting_for.wait_id]
    assert [f.seq for f in frames] == list(range(1, len(frames) + 1))
    # The same answer again changes nothing; another is refused: it no longer waits.
    again = await client.resume(first, {"say": "no"}, request_id="answer-1")
    assert again.duplicate
    with pytest.raises(ClientError) as refused:
        await client.resume(first, {"say": "no"})
    assert refused.value.code == ErrorCode.NOT_WAITING
    assert refused.value.retryable is False
    # An answer to a wait it does not wait for is refused; then the right one goes.
    with pytest.raises(ClientError) as wrong:
        await client.resume(second, {"say": "no"}, wait_id="interrupt-9")
    assert wrong.value.code == ErrorCode.NOT_WAITING
    await client.resume(second, {"say": "no"}, wait_id="interrupt-1")
    _, transcript = await collect(client, second)
    assert transcript.text == "hello you said no"
    # How long each wait lasted is observed once, by the attempt that went on.
    count, seconds = _answered_waits()
    assert count - observed_before[0] == 2
    assert seconds > observed_before[1]


def _answered_waits() -> tuple[float, float]:
    """runwire_wait_duration_seconds{kind="interrupt",outcome="answered"}: count, sum."""
    (family,) = WAIT_DURATION.collect()
    of = {
        s.name.rpartition("_")[2]: s.value
        for s in family.samples
        if s.labels == {"kind": "interrupt", "outcome": "answered"}
    }
    return of.get("count", 0.0), of.get("sum", 0.0)


@WAITING
async def test_signals_sent_before_the_run_waits_are_kept_and_taken_in_order(
    stack: InProcessStack,
) -> None:
    client = stack.client
    run_id = (await client.submit({}, runner="collects")).run.run_id
    await _waiting(stack, run_id)  # for "ready?", not for a signal yet
    first = await client.signal(run_id, "paid", {"amount": 5}, request_id="pay-1")
    assert not first.delivered
    assert (await client.signal(run_id, "paid", {"amount": 5}, request_id="pay-1")).duplicate
    await client.signal(run_id, "paid", {"amount": 7}, request_id="pay-2")
    await client.resume(run_id, "go")
    _, transcript = await collect(client, run_id)
    run = await client.get(run_id)
    assert run.status == RunStatus.FINISHED, run.error
    assert transcript.text == "paid 5 then 7"
    assert run.result == {"text": "paid 5 then 7", "paid": [5, 7]}
    with pytest.raises(ClientError) as ended:
        await client.signal(run_id, "paid", {"amount": 1})
    assert ended.value.code == ErrorCode.NOT_WAITING


@WAITING
async def test_a_signal_to_a_waiting_run_wakes_it(stack: InProcessStack) -> None:
    client = stack.client
    run_id = (await client.submit({}, runner="collects")).run.run_id
    await _waiting(stack, run_id)
    await client.resume(run_id, "go")
    waiting = await _waiting(stack, run_id)
    assert waiting.waiting_for is not None
    assert (waiting.waiting_for.kind, waiting.waiting_for.name) == (WaitKind.SIGNAL, "paid")
    assert (await client.signal(run_id, "paid", {"amount": 1})).delivered
    await _waiting(stack, run_id)  # for the second
    assert (await client.signal(run_id, "paid", {"amount": 2})).delivered
    _, transcript = await collect(client, run_id)
    assert transcript.text == "paid 1 then 2"


@WAITING
@pytest.mark.parametrize("handled", [True, False])
async def test_a_wait_past_its_timeout_raises_in_the_runner(
    stack: InProcessStack, handled: bool
) -> None:
    client = stack.client
    reply = await client.submit({"timeout": 0.3, "handle_timeout": handled}, runner="asks")
    _, transcript = await collect(client, reply.run.run_id)
    run = await client.get(reply.run.run_id)
    if handled:
        assert run.status == RunStatus.FINISHED
        assert transcript.text == "hello no answer"
    else:
        assert run.status == RunStatus.FAILED
        assert run.error is not None
        assert run.error.code == ErrorCode.WAIT_TIMEOUT
        assert run.error.retryable is False
    # An answer after the timeout decided the wait is refused.
    with pytest.raises(ClientError) as late:
        await client.resume(reply.run.run_id, {"say": "late"})
    assert late.value.code == ErrorCode.NOT_WAITING


@WAITING
async def test_a_waiting_run_is_canceled_at_once(stack: InProcessStack) -> None:
    client = stack.client
    run_id = (await client.submit({}, runner="asks")).run.run_id
    await _waiting(stack, run_id)
    canceled = await client.cancel(run_id)
    assert canceled.status == RunStatus.CANCELED
    frames, _ = await collect(client, run_id)
    assert frames[-1].type == FrameType.DONE
    assert frames[-1].data["status"] == RunStatus.CANCELED
    with pytest.raises(ClientError) as refused:
        await client.resume(run_id, {"say": "too late"})
    assert refused.value.code == ErrorCode.NOT_WAITING


@WAITING
async def test_an_answer_racing_the_timeout_is_decided_once(stack: InProcessStack) -> None:
    """Each answer sent about when its wait times out either wins (the runner gets it)
    or is refused NOT_WAITING (the runner sees the timeout): never both, never neither."""
    client = stack.client
    runs = [
        (
            await client.submit({"timeout": timeout, "handle_timeout": True}, runner="asks")
        ).run.run_id
        # Every other wait is long: its answer surely wins.
        for timeout in [60.0, 1.0] * 15
    ]
    # Each has asked (or already timed out), so every answer below is to a wait begun.
    for run_id in runs:
        await _waiting(stack, run_id, or_ended=True)

    async def answer(run_id: str) -> ErrorCode | None:
        try:
            await client.resume(run_id, {"say": "in time"})
        except ClientError as exc:
            return exc.code
        return None

    # Answered one after another, as the timeouts come due around them.
    refusals = [await answer(run_id) for run_id in runs]
    assert set(refusals) <= {None, ErrorCode.NOT_WAITING}
    accepted = [code is None for code in refusals]
    for run_id, took in zip(runs, accepted, strict=True):
        _, transcript = await collect(client, run_id)
        run = await client.get(run_id)
        assert run.status == RunStatus.FINISHED, run.error
        assert run.result is not None
        if took:
            assert run.result["answer"] == {"say": "in time"}
            assert transcript.text == "hello you said in time"
        else:
            assert run.result["answer"] is None
            assert transcript.text == "hello no answer"
    assert all(accepted[::2])


async def _past(timeout_at: datetime | None) -> bool:
    assert timeout_at is not None
    return datetime.now(UTC) > timeout_at


@WAITING
async def test_an_answer_after_the_timeout_is_refused_while_recovery_is_away(
    stack: InProcessStack,
) -> None:
    """The deadline decides, not recovery's tick: past it, an answer is refused and a
    signal is kept (not taken by the wait), though no recovery has timed the wait out
    yet; once recovery is back the runner sees the timeout."""
    client = stack.client
    await stack.stop_service("recovery")  # nothing times waits out meanwhile
    asking = (await client.submit({"timeout": 0.3, "handle_timeout": True}, runner="asks")).run
    paying = (await client.submit({"timeout": 0.3}, runner="expects")).run
    for run in (asking, paying):
        waiting = (await _waiting(stack, run.run_id)).waiting_for
        assert waiting is not None
        await eventually(lambda at=waiting.timeout_at: _past(at), timeout=10)
    with pytest.raises(ClientError) as late:
        await client.resume(asking.run_id, {"say": "late"})
    assert late.value.code == ErrorCode.NOT_WAITING
    assert "timed out" in late.value.message
    kept = await client.signal(paying.run_id, "paid", {"amount": 5})
    assert not kept.delivered
    assert (await client.get(asking.run_id)).status == RunStatus.WAITING
    stack.start_recovery("recovery")
    for run, said in ((asking, "hello no answer"), (paying, "not paid")):
        _, transcript = await collect(client, run.run_id)
        assert transcript.text == said
        assert (await client.get(run.run_id)).status == RunStatus.FINISHED


@WAITING
async def test_a_timeout_that_meets_an_answer_in_postgres_leaves_the_answer(
    stack: InProcessStack,
) -> None:
    """An answer's transaction holds the run when recovery's timeout comes due: the
    timeout, which found the wait undecided, waits for it and then decides nothing."""
    client = stack.client
    await stack.stop_service("recovery")
    run_id = (await client.submit({"timeout": 1.0}, runner="asks")).run.run_id
    waiting = (await _waiting(stack, run_id)).waiting_for
    assert waiting is not None
    # The store's two connections: the answer's, the timeout's; a third looks on.
    looking = await asyncpg.connect(stack.db_url)
    try:
        async with stack.store._pool.acquire() as answering, answering.transaction():
            answer = "SELECT resume_run('default', $1, NULL, $2, 'meets', 'test')"
            said = await answering.fetchval(answer, uuid.UUID(run_id), {"say": "first"})
            assert said == "resumed"
            await eventually(lambda: _past(waiting.timeout_at), timeout=10)
            timing_out = asyncio.create_task(stack.store.time_out_waits(10, "recovery"))

            async def blocked() -> bool:
                return bool(
                    await looking.fetchval(
                        "SELECT count(*) FROM pg_stat_activity"
                        " WHERE wait_event_type = 'Lock' AND query LIKE '%time_out_waits%'"
                    )
                )

            await eventually(blocked, timeout=10)
    finally:
        await looking.close()
    assert await asyncio.wait_for(timing_out, 10) == []
    stack.start_recovery("recovery")  # its sweep publishes the answer's job
    _, transcript = await collect(client, run_id)
    assert transcript.text == "hello you said first"


@WAITING
async def test_a_long_sleep_is_a_durable_timer_that_holds_no_worker(stack: InProcessStack) -> None:
    client = stack.client
    run_id = (await client.submit({"seconds": 1.0}, runner="naps", max_attempts=1)).run.run_id
    waiting = await _waiting(stack, run_id)
    assert waiting.waiting_for is not None
    assert waiting.waiting_for.kind == WaitKind.SLEEP
    assert waiting.waiting_for.timeout_at is not None
    # Asleep, it holds no worker: another run of the runner (one at a time) sleeps too.
    other = (await client.submit({"seconds": 1.0}, runner="naps")).run.run_id
    await _waiting(stack, other)
    _, transcript = await collect(client, run_id)
    run = await client.get(run_id)
    assert run.status == RunStatus.FINISHED, run.error
    assert transcript.text == "good night good morning"
    assert run.result is not None
    assert run.result["attempt"] == 2
    assert run.ended_at is not None
    assert run.ended_at >= waiting.waiting_for.timeout_at
    # A short sleep stays in the attempt.
    short = (await client.submit({"seconds": 0.1}, runner="naps")).run.run_id
    _, transcript = await collect(client, short)
    assert (await client.get(short)).result == {"text": "good night good morning", "attempt": 1}


@WAITING
async def test_a_waiting_run_is_answered_and_signaled_over_http(
    stack: InProcessStack, tmp_path: Path
) -> None:
    client = stack.client
    key = "rw_test-waits-key"
    run_id = (await client.submit({}, runner="collects")).run.run_id
    await _waiting(stack, run_id)
    async with (
        serve_gateway(stack.nats_url, stack.prefix, {key: "default"}, tmp_path) as url,
        httpx.AsyncClient(base_url=url, headers={"x-api-key": key}, timeout=10) as http,
    ):
        signal = {"name": "paid", "payload": {"amount": 3}, "request_id": "pay-3"}
        kept = await http.post(f"/v1/runs/{run_id}/signal", json=signal)
        assert kept.status_code == 200, kept.text
        assert kept.json()["delivered"] is False
        resumed = await http.post(f"/v1/runs/{run_id}/resume", json={"value": "go"})
        assert resumed.status_code == 200, resumed.text
        assert resumed.json()["run"]["run_id"] == run_id
        await _waiting(stack, run_id)  # for the second payment
        paid = await http.post(
            f"/v1/runs/{run_id}/signal", json={"name": "paid", "payload": {"amount": 4}}
        )
        assert paid.json()["delivered"] is True
        _, transcript = await collect(client, run_id)
        assert transcript.text == "paid 3 then 4"
        # It waits no more: 409 NOT_WAITING; a body that is not a command: 400.
        late = await http.post(f"/v1/runs/{run_id}/resume", json={"value": 1})
        assert (late.status_code, late.json()["error"]["code"]) == (409, "NOT_WAITING")
        bad = await http.post(f"/v1/runs/{run_id}/signal", json={"name": "no spaces"})
        assert (bad.status_code, bad.json()["error"]["code"]) == (400, "INVALID_REQUEST")
        no_key = await http.post(
            f"/v1/runs/{run_id}/resume", json={"value": 1}, headers={"x-api-key": "nope"}
        )
        assert no_key.status_code == 401


@WAITING
async def test_the_cli_shows_the_question_and_answers_it(stack: InProcessStack) -> None:
    client = stack.client
    run_id = (await client.submit({}, runner="asks")).run.run_id
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNWIRE_")}
    env |= {"RUNWIRE_NATS_URL": stack.nats_url, "RUNWIRE_PREFIX": stack.prefix}
    watch = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "runwire.client.cli",
        "watch",
        run_id,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert watch.stdout is not None
    asked = ""
    while "waiting for an answer" not in asked:
        line = await asyncio.wait_for(watch.stdout.readline(), 30)
        assert line, (await watch.stderr.read()).decode() if watch.stderr else ""
        asked += line.decode()
    assert f"runwire resume {run_id} --value JSON" in asked
    assert '{"question": "may I?"}' in asked
    answer = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "runwire.client.cli",
        "resume",
        run_id,
        "--value",
        '{"say": "sure"}',
        env=env,
        stdout=asyncio.subprocess.PIPE,
    )
    said, _ = await asyncio.wait_for(answer.communicate(), 30)
    assert answer.returncode == 0
    assert run_id in said.decode()
    rest, _ = await asyncio.wait_for(watch.communicate(), 30)
    assert watch.returncode == 0
    assert "you said sure" in rest.decode()
    assert f"run {run_id} finished" in rest.decode()


@WAITING
async def test_a_waiting_run_holds_its_session_as_a_running_one_does(
    stack: InProcessStack,
) -> None:
    client = stack.client
    asking = (await client.submit({}, runner="asks", session_id="s")).run.run_id
    await _waiting(stack, asking)
    # Enqueued behind it: the next run starts once the waiting one has ended.
    queued = (
        await client.submit({"tokens": ["next"]}, session_id="s", multitask="enqueue")
    ).run.run_id
    assert (await client.get(queued)).status == RunStatus.QUEUED
    await client.resume(asking, {"say": "ok"})
    _, first = await collect(client, asking)
    _, second = await collect(client, queued)
    assert (first.text, second.text) == ("hello you said ok", "next")
    # A run that interrupts the session cancels a waiting run at once.
    asking = (await client.submit({}, runner="asks", session_id="t")).run.run_id
    await _waiting(stack, asking)
    interrupting = (await client.submit({"tokens": ["now"]}, session_id="t")).run.run_id
    _, transcript = await collect(client, interrupting)
    assert transcript.text == "now"
    assert (await client.get(asking)).status == RunStatus.CANCELED


async def test_a_waiting_run_is_answered_after_the_whole_stack_restarted(tmp_path: Path) -> None:
    """`make down` and `make up` between the question and the answer: nothing held the
    run meanwhile, and it goes on from its checkpoint with the answer."""
    runners = "asks=tests.waiting:asks"
    async with local_stack(tmp_path, RUNWIRE_RUNNERS=runners, PYTHONPATH=str(ROOT)) as stack:
        assert stack.returncode == 0, stack.output
        client = await client_of(stack.env())
        try:
            run_id = (await client.submit({}, runner="asks")).run.run_id

            async def waits() -> bool:
                return (await client.get(run_id)).status == RunStatus.WAITING

            await eventually(waits, timeout=30)
        finally:
            await client.close()
        for command in ("down", "up"):
            code, output = await stack_command(stack.folder, command, stack.shell)
            assert code == 0, output
        client = await client_of(stack.env())
        try:
            assert (await client.get(run_id)).status == RunStatus.WAITING
            await client.resume(run_id, {"say": "still here"})
            frames, transcript = await collect(client, run_id)
        finally:
            await client.close()
    assert transcript.text == "hello you said still here"
    assert [f.seq for f in frames] == list(range(1, len(frames) + 1))


@WAITING
async def test_a_signal_url_takes_a_third_partys_post_without_an_api_key(
    stack: InProcessStack, tmp_path: Path
) -> None:
    client = stack.client
    key = "rw_test-waits-key"
    run_id = (await client.submit({}, runner="collects")).run.run_id
    other = (await client.submit({}, runner="collects")).run.run_id
    await _waiting(stack, run_id)
    async with (
        serve_gateway(
            stack.nats_url,
            stack.prefix,
            {key: "default"},
            tmp_path,
            gateway_signal_secret="a-secret-of-the-gateway-0123456789",
        ) as url,
        httpx.AsyncClient(base_url=url, timeout=10) as http,
    ):
        made = await http.get(
            f"/v1/runs/{run_id}/signal-url", params={"name": "paid"}, headers={"x-api-key": key}
        )
        assert made.status_code == 200, made.text
        signal_url = made.json()["url"]
        assert signal_url.startswith(f"{url}/v1/signals/default/{run_id}/paid/")
        # The third party: no API key; a delivery sent twice (the same webhook-id) is one.
        for _ in range(2):
            sent = await http.post(signal_url, json={"amount": 3}, headers={"webhook-id": "wh_1"})
            assert sent.status_code == 200, sent.text
        assert sent.json()["duplicate"] is True
        # The token is for that run and that signal only.
        token = signal_url.rsplit("/", 1)[1]
        for forged in (
            signal_url[: -len(token)] + token[:-2] + "xx",
            signal_url.replace(run_id, other),
            signal_url.replace("/paid/", "/refund/"),
        ):
            refused = await http.post(forged, json={"amount": 9})
            assert (refused.status_code, refused.json()["error"]["code"]) == (404, "NOT_FOUND")
        await client.resume(run_id, "go")
        await _waiting(stack, run_id)
        second = await http.post(signal_url, json={"amount": 4})
        assert second.json()["delivered"] is True
        _, transcript = await collect(client, run_id)
    assert transcript.text == "paid 3 then 4"


@WAITING
async def test_list_shows_the_tenants_runs_newest_first_and_what_waiting_ones_wait_for(
    stack: InProcessStack, tmp_path: Path
) -> None:
    client = stack.client
    done = (await client.submit({"tokens": ["x"]})).run.run_id
    await collect(client, done)
    asking = [(await client.submit({}, runner="asks")).run.run_id for _ in range(3)]
    for run_id in asking:
        await _waiting(stack, run_id)
    waiting = await client.list_runs(status=RunStatus.WAITING, limit=2)
    assert [r.run_id for r in waiting.runs] == asking[::-1][:2]
    assert all(r.waiting_for is not None for r in waiting.runs)
    assert waiting.runs[0].waiting_for is not None
    assert waiting.runs[0].waiting_for.payload == {"question": "may I?"}
    assert waiting.next is not None
    rest = await client.list_runs(status="waiting", limit=2, before=waiting.next)
    assert ([r.run_id for r in rest.runs], rest.next) == ([asking[0]], None)
    every = await client.list_runs()
    assert [r.run_id for r in every.runs] == [*asking[::-1], done]
    assert every.runs[-1].waiting_for is None
    assert [r.run_id for r in (await client.list_runs(runner="scripted")).runs] == [done]
    # The CLI says it in a line each; the gateway as JSON.
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNWIRE_")}
    env |= {"RUNWIRE_NATS_URL": stack.nats_url, "RUNWIRE_PREFIX": stack.prefix}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "runwire.client.cli",
        "list",
        "--status",
        "waiting",
        env=env,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    lines = out.decode().splitlines()
    assert [line.split()[0] for line in lines] == asking[::-1]
    assert all('waits (interrupt interrupt-1): {"question": "may I?"}' in line for line in lines)
    key = "rw_test-list-key"
    async with (
        serve_gateway(stack.nats_url, stack.prefix, {key: "default"}, tmp_path) as url,
        httpx.AsyncClient(base_url=url, headers={"x-api-key": key}, timeout=10) as http,
    ):
        page = await http.get("/v1/runs", params={"status": "waiting", "limit": "1"})
        assert page.status_code == 200, page.text
        assert [r["run_id"] for r in page.json()["runs"]] == [asking[-1]]
        bad = await http.get("/v1/runs", params={"status": "asleep"})
        assert bad.status_code == 400
