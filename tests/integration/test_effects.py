"""Side effects through the fence: performed once across attempts, shown as frames,
refusals fail the run (a real HTTP endpoint that counts charges per idempotency key)."""

import json
from typing import Any

import asyncpg
import pytest
from pydantic import ValidationError

from runwire import ClientError
from runwire.contracts.errors import ErrorCode
from runwire.contracts.frames import FrameType
from runwire.contracts.status import RunStatus
from tests.effect_server import EffectServer
from tests.runners import charge
from tests.services import InProcessStack, collect

pytestmark = pytest.mark.integration


def _charge(server: EffectServer, **extra: Any) -> dict[str, Any]:
    return {
        "url": f"{server.url}/charge",
        "status_url": f"{server.url}/charges/{{idempotency_key}}",
        "amount": 40,
        **extra,
    }


async def _effects(db_url: str, run_id: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(db_url)
    try:
        return list(await conn.fetch("SELECT * FROM effects WHERE run_id = $1", run_id))
    finally:
        await conn.close()


async def test_an_effect_is_dispatched_once_and_its_steps_are_frames(
    infra: Any, db_url: str, prefix: str
) -> None:
    async with (
        EffectServer() as server,
        InProcessStack(infra.nats_url, db_url, prefix, runners={"charge": charge}) as stack,
    ):
        reply = await stack.client.submit(_charge(server), runner="charge")
        frames, transcript = await collect(stack.client, reply.run.run_id)
        run = await stack.client.get(reply.run.run_id)
        (row,) = await _effects(db_url, reply.run.run_id)

    assert run.status == RunStatus.FINISHED
    assert transcript.text == "charged 40 as ch_1"
    assert list(server.charges.values()) == [1]
    steps = [f.data for f in frames if f.type == FrameType.EFFECT]
    assert [s["state"] for s in steps] == ["prepared", "claimed", "committed"]
    assert steps[-1]["receipt_id"] == "ch_1"
    assert (steps[-1]["key"], steps[-1]["kind"]) == ("charge", "http")
    assert (row["state"], row["fence"]) == ("committed", 1)
    assert json.loads(row["receipt"])["id"] == "ch_1"


async def test_a_retried_attempt_gets_the_stored_receipt_and_charges_nothing(
    infra: Any, db_url: str, prefix: str
) -> None:
    async with (
        EffectServer() as server,
        InProcessStack(infra.nats_url, db_url, prefix, runners={"charge": charge}) as stack,
    ):
        script = _charge(server, fail_after_charge_on_attempt=1)
        reply = await stack.client.submit(script, runner="charge")
        frames, transcript = await collect(stack.client, reply.run.run_id)
        run = await stack.client.get(reply.run.run_id)

    assert (run.status, run.attempts) == (RunStatus.FINISHED, 2)
    assert transcript.text == "charged 40 as ch_1"
    assert list(server.charges.values()) == [1]
    # The second attempt's effect is already committed: no claim, no dispatch.
    states = [f.data["state"] for f in frames if f.type == FrameType.EFFECT]
    assert states == ["prepared", "claimed", "committed"]


async def test_a_refused_effect_fails_the_run_with_effect_failed(
    infra: Any, db_url: str, prefix: str
) -> None:
    async with (
        EffectServer() as server,
        InProcessStack(infra.nats_url, db_url, prefix, runners={"charge": charge}) as stack,
    ):
        reply = await stack.client.submit(_charge(server, amount=5000), runner="charge")
        frames, _ = await collect(stack.client, reply.run.run_id)
        run = await stack.client.get(reply.run.run_id)
        (row,) = await _effects(db_url, reply.run.run_id)

    assert (run.status, run.attempts) == (RunStatus.FAILED, 1)
    assert run.error is not None
    assert run.error.code == ErrorCode.EFFECT_FAILED
    assert "card declined" in run.error.message
    assert row["state"] == "failed"
    assert [f.data["state"] for f in frames if f.type == FrameType.EFFECT][-1] == "failed"


async def test_a_dispatch_past_its_deadline_fails_the_effect_once(
    infra: Any, db_url: str, prefix: str
) -> None:
    async with (
        EffectServer() as server,
        InProcessStack(
            infra.nats_url,
            db_url,
            prefix,
            runners={"charge": charge},
            overrides={"effect_claim_ms": 500},
        ) as stack,
    ):
        server.hold = True
        reply = await stack.client.submit(_charge(server), runner="charge")
        frames, _ = await collect(stack.client, reply.run.run_id)
        run = await stack.client.get(reply.run.run_id)

    assert (run.status, run.attempts) == (RunStatus.FAILED, 1)
    assert run.error is not None
    assert (run.error.code, run.error.retryable) == (ErrorCode.EFFECT_DEADLINE_EXCEEDED, False)
    assert [(e.key, e.state) for e in run.effects] == [("charge", "failed")]
    assert [f.data["state"] for f in frames if f.type == FrameType.EFFECT][-1] == "failed"


async def test_an_unknown_effect_shows_in_get_and_an_operator_resolves_it(
    infra: Any, db_url: str, prefix: str
) -> None:
    async with (
        EffectServer() as server,
        InProcessStack(infra.nats_url, db_url, prefix, runners={"charge": charge}) as stack,
    ):
        server.fail_with = 503  # the outcome cannot be known, and there is no status URL
        script = {"url": f"{server.url}/charge", "amount": 40}
        reply = await stack.client.submit(script, runner="charge", max_attempts=1)
        frames, _ = await collect(stack.client, reply.run.run_id)
        run_id = reply.run.run_id
        seen = await stack.client.get(run_id)
        resolved = await stack.client.resolve_effect(run_id, "charge", receipt={"id": "ch_manual"})
        with pytest.raises(ClientError) as again:
            await stack.client.resolve_effect(run_id, "charge", error="never mind")
        with pytest.raises(ClientError) as missing:
            await stack.client.resolve_effect(run_id, "refund", error="no")
        with pytest.raises(ValidationError):
            await stack.client.resolve_effect(run_id, "charge")

    assert [(e.key, e.state) for e in seen.effects] == [("charge", "unknown")]
    assert [f.data["state"] for f in frames if f.type == FrameType.EFFECT][-1] == "unknown"
    assert [(e.state, e.receipt_id) for e in resolved.effects] == [("reconciled", "ch_manual")]
    assert (again.value.code, again.value.retryable) == (ErrorCode.INVALID_REQUEST, False)
    assert "reconciled" in again.value.message
    assert missing.value.code == ErrorCode.NOT_FOUND
