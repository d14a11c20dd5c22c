"""Bad input on every command subject gets a clear error, and the services keep serving."""

import json
import uuid

import pytest

from runwire.contracts.errors import ErrorCode, ErrorReply
from runwire.contracts.status import RunStatus
from tests.services import InProcessStack, collect

pytestmark = pytest.mark.integration


async def _raw(stack: InProcessStack, command: str, body: bytes, tenant: str = "default") -> dict:  # type: ignore[type-arg]
    msg = await stack.client.nc.request(
        stack.client.subjects.command(tenant, command), body, timeout=10
    )
    reply: dict = json.loads(msg.data)  # type: ignore[type-arg]
    return reply


def _error(reply: dict) -> tuple[ErrorCode, bool]:  # type: ignore[type-arg]
    parsed = ErrorReply.model_validate(reply)
    assert parsed.error.message
    return parsed.error.code, parsed.error.retryable


VALID = {"v": 1, "request_id": "x", "input": {"tokens": ["ok"]}}

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
    ("get", b"{}", ErrorCode.INVALID_REQUEST),
    ("get", json.dumps({"v": 1, "run_id": 7}).encode(), ErrorCode.INVALID_REQUEST),
    ("cancel", b"nope", ErrorCode.INVALID_REQUEST),
    ("abort_session", json.dumps({"v": 1}).encode(), ErrorCode.INVALID_REQUEST),
    ("join", b"nope", ErrorCode.INVALID_REQUEST),
    ("join", json.dumps({"v": 1, "run_id": "x", "after": -1}).encode(), ErrorCode.INVALID_REQUEST),
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
