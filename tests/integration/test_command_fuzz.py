"""A property over every command subject: whatever the body, the reply is a documented
result or error with the right `retryable`, a refused command creates nothing, and no
service stops. `make test` tries a few hundred bodies; `make fuzz` ten thousand
(RUNWIRE_FUZZ_EXAMPLES)."""

import json
import os
import uuid
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runwire.contracts.commands import BODIES
from runwire.contracts.errors import ErrorCode, ErrorReply
from runwire.contracts.subjects import COMMANDS
from tests.services import InProcessStack

pytestmark = pytest.mark.integration

EXAMPLES = int(os.environ.get("RUNWIRE_FUZZ_EXAMPLES", "300"))
# Codes a client may get for what it sent: never retryable.
REFUSALS = {
    ErrorCode.INVALID_REQUEST,
    ErrorCode.PAYLOAD_TOO_LARGE,
    ErrorCode.NOT_FOUND,
    ErrorCode.SESSION_BUSY,
    ErrorCode.QUOTA_EXCEEDED,
    ErrorCode.NOT_WAITING,
    ErrorCode.NOT_RESCHEDULABLE,
}
# A valid body of each command, which the fuzzer changes a field of.
VALID: dict[str, dict[str, Any]] = {
    "submit": {"v": 1, "request_id": "r", "input": {"tokens": ["ok"]}},
    "get": {"v": 1, "run_id": str(uuid.uuid4())},
    "list": {"v": 1, "status": "waiting", "limit": 5, "created_after": "2026-01-02T03:04:05Z"},
    "cancel": {"v": 1, "run_id": str(uuid.uuid4())},
    "join": {"v": 1, "run_id": str(uuid.uuid4()), "after": 0},
    "abort_session": {"v": 1, "session_id": "s"},
    "end_tenant": {"v": 1},
    "forget_tenant": {"v": 1},
    "resume": {"v": 1, "request_id": "r", "run_id": str(uuid.uuid4()), "value": {"ok": True}},
    "signal": {"v": 1, "request_id": "r", "run_id": str(uuid.uuid4()), "name": "paid"},
    "reschedule": {"v": 1, "run_id": str(uuid.uuid4()), "delay_ms": 1000},
    "set_webhooks": {
        "v": 1,
        "endpoints": [{"url": "https://hooks.example.com/x", "events": ["ended"]}],
    },
    "get_webhooks": {"v": 1},
    "set_schedule": {"v": 1, "name": "fuzzed", "cron": "0 9 * * *", "input": {"tokens": ["x"]}},
    "remove_schedule": {"v": 1, "name": "nope"},
    "list_schedules": {"v": 1},
    "backfill_schedule": {
        "v": 1,
        "name": "nope",
        "start": "2026-01-01T00:00:00Z",
        "end": "2026-01-02T00:00:00Z",
    },
    "resolve_effect": {"v": 1, "run_id": str(uuid.uuid4()), "key": "k", "error": "no"},
    "set_budget": {"v": 1, "tokens": 1_000_000},
    "get_budget": {"v": 1},
    "set_policy": {"v": 1, "effects": None},
    "get_policy": {"v": 1},
    "set_rate_limit": {"v": 1, "key": "openai:fuzz-model", "tpm": 1000},
    "get_rate_limits": {"v": 1},
    "release": {
        "v": 1,
        "release_id": "fuzzed",
        "version": 1,
        "definition": {"nodes": [{"id": "a", "runner": "scripted", "input": {"tokens": ["ok"]}}]},
    },
}

NESTED_LIST: list[Any] = []
for _ in range(80):
    NESTED_LIST = [NESTED_LIST]

# What has hurt before: text Postgres cannot store, numbers past every column, strings
# for numbers, nesting, sizes at the limits.
UNSTORABLE = ["\x00", "a\x00b", "\ud800", "x\udfffy"]
NASTY = st.sampled_from(
    [
        *UNSTORABLE * 3,
        "3",
        "true",
        "",
        " ",
        "x" * 201,
        "default.other",
        2**31,
        2**53,
        2**63,
        -(2**63) - 1,
        10**150,
        -1,
        0,
        1.5,
        1e308,
        True,
        False,
        None,
        [],
        {},
        NESTED_LIST,
    ]
)
LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**120), max_value=10**120)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
    | NASTY
)
VALUES = st.recursive(
    LEAVES,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _deep(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = {"a": value}
    return value


@st.composite
def bodies(draw: st.DrawFn) -> tuple[str, bytes]:
    """A command name and a body: mostly a valid one with one of its fields (or one it
    does not have) set to something nasty or random; else anything at all."""
    command = draw(st.sampled_from(COMMANDS))
    shape = draw(st.sampled_from(["field"] * 4 + ["nested"] * 3 + ["whole", "raw", "deep"]))
    if shape == "whole":
        return command, json.dumps(draw(VALUES)).encode()
    if shape == "raw":
        return command, draw(st.binary(max_size=64))
    body = dict(VALID[command])
    if "request_id" in body:
        body["request_id"] = str(uuid.uuid4())
    if shape == "deep":
        where = draw(st.sampled_from(["input", "metadata", "receipt"]))
        body[where] = _deep(draw(st.integers(60, 300)))
    elif shape == "nested":
        where = draw(st.sampled_from(["input", "metadata", "receipt"]))
        nasty = draw(NASTY)
        body[where] = draw(st.sampled_from([{"tokens": [nasty]}, {"k": nasty}, {str(nasty): 1}]))
    else:
        fields = [*BODIES[command].model_fields, "surprise"]
        body[draw(st.sampled_from(fields))] = draw(st.one_of(NASTY, NASTY, VALUES))
    return command, json.dumps(body).encode()


async def _runs(db_url: str) -> int:
    conn = await asyncpg.connect(db_url)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM runs"))
    finally:
        await conn.close()


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize="RUNWIRE_FUZZ_EXAMPLES" not in os.environ,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=bodies())
async def test_every_command_answers_any_body_with_a_documented_reply(
    stack: InProcessStack, db_url: str, case: tuple[str, bytes]
) -> None:
    command, body = case
    before = await _runs(db_url)
    msg = await stack.client.nc.request(
        stack.client.subjects.command("default", command), body, timeout=10
    )
    reply = json.loads(msg.data)
    stack.check_alive()  # no service stopped
    assert isinstance(reply, dict), reply
    if reply.get("ok") is True:
        return
    error = ErrorReply.model_validate(reply).error
    assert error.code != ErrorCode.UNAVAILABLE, (command, body[:300], error)
    assert error.code in REFUSALS, (command, body[:300], error)
    assert error.retryable is False, (command, body[:300], error)
    assert "asyncpg" not in error.message
    assert "SQL" not in error.message
    if command == "submit":
        assert await _runs(db_url) == before, "a refused submit created a run"
