"""Bad input on every command subject gets a clear error, and the services keep serving."""

import json
import uuid
from typing import Any

import pytest

from runwire import ClientError
from runwire.contracts.errors import ErrorCode, ErrorReply
from runwire.contracts.frames import FrameType
from runwire.contracts.status import RunStatus
from runwire.contracts.subjects import inbox_prefix
from runwire.executor.main import executor_consumer
from tests.services import InProcessStack, collect, eventually

pytestmark = pytest.mark.integration


async def _raw(stack: InProcessStack, command: str, body: bytes, tenant: str = "default") -> dict:  # type: ignore[type-arg]
    # Answered only in the tenant's own inbox: ask from there, as its clients do.
    nc = stack.client.nc
    inbox = f"{inbox_prefix(tenant)}.{uuid.uuid4().hex}"
    sub = await nc.subscribe(inbox, max_msgs=1)
    await nc.publish(stack.client.subjects.command(tenant, command), body, reply=inbox)
    msg = await sub.next_msg(timeout=10)
    reply: dict = json.loads(msg.data)  # type: ignore[type-arg]
    return reply


def _error(reply: dict) -> tuple[ErrorCode, bool]:  # type: ignore[type-arg]
    parsed = ErrorReply.model_validate(reply)
    assert parsed.error.message
    return parsed.error.code, parsed.error.retryable


VALID = {"v": 1, "request_id": "x", "input": {"tokens": ["ok"]}}
NESTED: object = {}
for _ in range(200):
    NESTED = {"a": NESTED}


def _body(**fields: object) -> bytes:
    """VALID with `fields` changed (a NUL or a lone surrogate is written as its escape)."""
    return json.dumps({**VALID, **fields}).encode()


def _raw_body(fields: str, *, base: bool = True) -> bytes:
    """A body written by hand (what json.dumps would never write)."""
    return ("{" + ('"v": 1, "request_id": "x", ' if base else '"v": 1, ') + fields + "}").encode()


CASES = [
    ("submit", b"not json at all", ErrorCode.INVALID_REQUEST),
    ("submit", b"\xff\xfe", ErrorCode.INVALID_REQUEST),
    ("submit", b"[1, 2]", ErrorCode.INVALID_REQUEST),
    ("submit", json.dumps({"v": 1, "input": {"tokens": []}}).encode(), ErrorCode.INVALID_REQUEST),
    ("submit", json.dumps({**VALID, "surprise": 1}).encode(), ErrorCode.INVALID_REQUEST),
    ("submit", json.dumps({**VALID, "max_attempts": "three"}).encode(), ErrorCode.INVALID_REQUEST),
    ("submit", json.dumps({**VALID, "v": 2}).encode(), ErrorCode.INVALID_REQUEST),
    ("submit", json.dumps({**VALID, "runner": "nope"}).encode(), ErrorCode.INVALID_REQUEST),
    (
        "submit",
        json.dumps({**VALID, "input": {"tokens": "abc"}}).encode(),
        ErrorCode.INVALID_REQUEST,
    ),
    ("submit", json.dumps({**VALID, "multitask": "sometimes"}).encode(), ErrorCode.INVALID_REQUEST),
    (
        "submit",
        json.dumps({**VALID, "input": {"tokens": ["x" * 1000] * 300}}).encode(),
        ErrorCode.PAYLOAD_TOO_LARGE,
    ),
    ("submit", b"{" + b" " * (2 * 1024 * 1024) + b"}", ErrorCode.PAYLOAD_TOO_LARGE),
    # A start time given twice, too far ahead, a priority out of range.
    (
        "submit",
        _body(delay_ms=1000, not_before="2030-01-01T00:00:00Z"),
        ErrorCode.INVALID_REQUEST,
    ),
    ("submit", _body(delay_ms=31 * 86_400_000), ErrorCode.INVALID_REQUEST),
    ("submit", _body(not_before="2030-01-01T00:00:00"), ErrorCode.INVALID_REQUEST),
    ("submit", _body(priority=11), ErrorCode.INVALID_REQUEST),
    ("submit", _body(concurrency_key=""), ErrorCode.INVALID_REQUEST),
    ("reschedule", json.dumps({"v": 1, "run_id": "x"}).encode(), ErrorCode.INVALID_REQUEST),
    ("get", b"{}", ErrorCode.INVALID_REQUEST),
    ("get", json.dumps({"v": 1, "run_id": 7}).encode(), ErrorCode.INVALID_REQUEST),
    ("cancel", b"nope", ErrorCode.INVALID_REQUEST),
    ("abort_session", json.dumps({"v": 1}).encode(), ErrorCode.INVALID_REQUEST),
    ("join", b"nope", ErrorCode.INVALID_REQUEST),
    ("join", json.dumps({"v": 1, "run_id": "x", "after": -1}).encode(), ErrorCode.INVALID_REQUEST),
    # What Postgres cannot store, or SQL cannot hold, is refused before it gets there.
    ("submit", _body(input=NESTED), ErrorCode.INVALID_REQUEST),
    ("submit", _raw_body('"input": {"n": ' + "9" * 5000 + "}"), ErrorCode.INVALID_REQUEST),
    ("submit", _raw_body('"input": {"n": 1e400}'), ErrorCode.INVALID_REQUEST),
    ("submit", _raw_body('"input": {"n": NaN}'), ErrorCode.INVALID_REQUEST),
    ("submit", _body(request_id="a\u0000b"), ErrorCode.INVALID_REQUEST),
    ("submit", _body(session_id="s\u0000"), ErrorCode.INVALID_REQUEST),
    ("submit", _body(input={"tokens": ["a\u0000"]}), ErrorCode.INVALID_REQUEST),
    ("submit", _body(metadata={"k\u0000": 1}), ErrorCode.INVALID_REQUEST),
    ("submit", _body(input={"tokens": ["\ud800"]}), ErrorCode.INVALID_REQUEST),
    ("submit", _body(max_attempts="3"), ErrorCode.INVALID_REQUEST),
    ("submit", _body(max_attempts=True), ErrorCode.INVALID_REQUEST),
    ("submit", _body(v=True), ErrorCode.INVALID_REQUEST),
    ("submit", _body(budget_tokens=2**63), ErrorCode.INVALID_REQUEST),
    ("submit", _body(metadata={"big": "x" * 20_000}), ErrorCode.PAYLOAD_TOO_LARGE),
    (
        "join",
        json.dumps({"v": 1, "run_id": "x", "after": 2**63}).encode(),
        ErrorCode.INVALID_REQUEST,
    ),
    ("set_budget", json.dumps({"v": 1, "tokens": 2**70}).encode(), ErrorCode.INVALID_REQUEST),
    ("set_budget", json.dumps({"v": 1, "tokens": "5"}).encode(), ErrorCode.INVALID_REQUEST),
    (
        "set_policy",
        json.dumps({"v": 1, "effects": ["Bad Kind"]}).encode(),
        ErrorCode.INVALID_REQUEST,
    ),
    (
        "resolve_effect",
        _raw_body('"run_id": "x", "key": "k\\u0000", "error": "e"', base=False),
        ErrorCode.INVALID_REQUEST,
    ),
]


@pytest.mark.parametrize(("command", "body", "code"), CASES)
async def test_bad_input_is_answered_and_service_keeps_serving(
    stack: InProcessStack, command: str, body: bytes, code: ErrorCode
) -> None:
    reply = await _raw(stack, command, body)
    assert reply["ok"] is False
    assert _error(reply) == (code, False)

    # The same service still answers a good command afterwards.
    good = await stack.client.submit({"tokens": ["still", " here"]})
    _, transcript = await collect(stack.client, good.run.run_id)
    assert transcript.text == "still here"
    stack.check_alive()


async def test_bad_input_creates_no_run(stack: InProcessStack) -> None:
    await _raw(stack, "submit", json.dumps({**VALID, "request_id": "bad", "x": 1}).encode())
    assert await stack.store.run_by_request("default", "bad") is None


async def test_unknown_runs_answer_not_found(stack: InProcessStack) -> None:
    for command in ("get", "cancel", "join"):
        for run_id in (str(uuid.uuid4()), "not-a-uuid"):
            reply = await _raw(stack, command, json.dumps({"v": 1, "run_id": run_id}).encode())
            assert _error(reply) == (ErrorCode.NOT_FOUND, False), (command, run_id)


async def test_tenant_comes_from_the_subject(stack: InProcessStack) -> None:
    reply = await _raw(stack, "submit", json.dumps(VALID).encode(), tenant="acme")
    assert reply["ok"] is True
    assert reply["run"]["tenant"] == "acme"
    run_id = reply["run"]["run_id"]
    # Another tenant cannot see it.
    other = await _raw(stack, "get", json.dumps({"v": 1, "run_id": run_id}).encode())
    assert _error(other) == (ErrorCode.NOT_FOUND, False)
    mine = await _raw(stack, "get", json.dumps({"v": 1, "run_id": run_id}).encode(), "acme")
    assert mine["run"]["run_id"] == run_id
    assert mine["run"]["status"] in {s.value for s in RunStatus}
    # A body naming a tenant is rejected: the tenant is never taken from the body.
    named = await _raw(stack, "submit", json.dumps({**VALID, "tenant": "acme"}).encode())
    assert _error(named) == (ErrorCode.INVALID_REQUEST, False)


def _job(run_id: str, generation: object = 1, **extra: object) -> bytes:
    body = {"v": 1, "run_id": run_id, "tenant": "default", "runner": "scripted"}
    return json.dumps({**body, "generation": generation, **extra}).encode()


POISON_JOBS = [
    b"not a job",
    _job("not-a-uuid"),
    _job(str(uuid.uuid4()), generation=2**40),
    _job(str(uuid.uuid4()), generation="1"),
    _job(str(uuid.uuid4())),  # names no run
]


async def test_jobs_that_are_not_jobs_of_real_runs_are_terminated_and_jam_nothing(
    stack: InProcessStack,
) -> None:
    js = stack.client.nc.jetstream()
    subjects = stack.client.subjects
    # More than the consumer's max_ack_pending: left pending, they would stop execution.
    for i in range(120):
        await js.publish(subjects.job("scripted", f"poison{i}"), POISON_JOBS[i % len(POISON_JOBS)])

    async def drained() -> bool:
        info = await js.consumer_info(subjects.jobs_stream, executor_consumer("scripted"))
        return info.num_pending == 0 and info.num_ack_pending == 0

    await eventually(drained, timeout=30)
    good = await stack.client.submit({"tokens": ["still", " runs"]})
    _, transcript = await collect(stack.client, good.run.run_id)
    assert transcript.text == "still runs"
    stack.check_alive()


async def test_limits_are_settings_with_coded_errors(infra: Any, db_url: str, prefix: str) -> None:
    # One frame per delta: the limit counts frames, and this runner emits 30 deltas at once.
    overrides = {"max_session_waiting": 2, "max_frames_per_run": 10, "coalesce_text": False}
    async with InProcessStack(infra.nats_url, db_url, prefix, overrides=overrides) as stack:
        slow = {"tokens": ["a"] * 50, "token_delay_ms": 20}
        for _ in range(2):
            await stack.client.submit(slow, session_id="s", multitask="enqueue")
        with pytest.raises(ClientError) as full:
            await stack.client.submit(slow, session_id="s", multitask="enqueue")
        chatty = await stack.client.submit({"tokens": ["t"] * 30})
        frames, _ = await collect(stack.client, chatty.run.run_id)
        run = await stack.client.get(chatty.run.run_id)

    assert (full.value.code, full.value.retryable) == (ErrorCode.SESSION_BUSY, False)
    assert "2 runs active or waiting; the limit is 2" in full.value.message
    assert run.status == RunStatus.FAILED
    assert run.error is not None
    assert (run.error.code, run.error.retryable) == (ErrorCode.PAYLOAD_TOO_LARGE, False)
    assert "RUNWIRE_MAX_FRAMES_PER_RUN=10" in run.error.message
    # Ten frames of the runner, then the run's closing frames.
    assert [f.type for f in frames][-2:] == [FrameType.ERROR, FrameType.DONE]
    assert len(frames) == 12
