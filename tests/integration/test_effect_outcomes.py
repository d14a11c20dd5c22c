"""Effects whose outcome was not known: settled after their run ended, corrected by an
operator after their deadline, and never taken for "not done" when a reconcile fails
(a real HTTP endpoint that counts charges and emails per idempotency key)."""

from collections.abc import AsyncIterator
from typing import Any

import pytest

from runwire.contracts.errors import ErrorCode
from runwire.contracts.frames import FrameType
from runwire.contracts.replies import RunSummary
from runwire.contracts.status import RunStatus
from tests.effect_server import EffectServer
from tests.runners import MAIL_API, charge, mailer, send_email
from tests.services import InProcessStack, collect, eventually

pytestmark = pytest.mark.integration


def _charge(server: EffectServer, **extra: Any) -> dict[str, Any]:
    return {
        "url": f"{server.url}/charge",
        "status_url": f"{server.url}/charges/{{idempotency_key}}",
        "amount": 40,
        **extra,
    }


async def _settled(stack: InProcessStack, run_id: str) -> RunSummary:
    """The run once none of its effects is `unknown` or `claimed` any more."""
    seen: list[RunSummary] = []

    async def closed() -> bool:
        seen.append(await stack.client.get(run_id))
        return all(e.state not in ("unknown", "claimed") for e in seen[-1].effects)

    await eventually(closed, timeout=20)
    return seen[-1]


@pytest.fixture
async def charging(
    request: pytest.FixtureRequest, infra: Any, db_url: str, prefix: str
) -> AsyncIterator[Any]:
    """The endpoint and a stack that may charge it; parametrized indirectly, the claim's
    deadline in ms (the default, 30 s, otherwise: a dispatch that a busy machine slows
    past a short one fails by its deadline, which only the test of deadlines asks for)."""
    claim_ms = getattr(request, "param", None)
    async with (
        EffectServer() as server,
        InProcessStack(
            infra.nats_url,
            db_url,
            prefix,
            db_roles=infra.service_roles,
            runners={"charge": charge},
            overrides={"effect_claim_ms": claim_ms} if claim_ms else {},
        ) as stack,
    ):
        await stack.allow_effects("http")
        yield server, stack


async def test_an_unknown_effect_of_a_failed_run_is_reconciled_and_charged(
    charging: tuple[EffectServer, InProcessStack],
) -> None:
    server, stack = charging
    server.lose_answers = 1  # charged, but the answer is lost: its outcome is unknown
    reply = await stack.client.submit(_charge(server, cost=30), runner="charge", max_attempts=1)
    await collect(stack.client, reply.run.run_id)
    failed = await stack.client.get(reply.run.run_id)
    run = await _settled(stack, reply.run.run_id)
    budget = await stack.client.budget()
    events = [e["event"] for e in await stack.store.run_events(reply.run.run_id)]

    assert failed.status == RunStatus.FAILED
    assert [(e.state, e.receipt_id) for e in run.effects] == [("reconciled", "ch_1")], run.effects
    assert list(server.charges.values()) == [1]  # reconciled, never dispatched again
    assert (budget.cost_used, budget.cost_reserved) == (30, 0)
    assert "effect_resolved" in events


async def test_an_effect_a_failed_run_never_performed_is_failed_and_released(
    charging: tuple[EffectServer, InProcessStack],
) -> None:
    server, stack = charging
    server.fail_with = 503  # nothing charged, and the endpoint says so when asked
    reply = await stack.client.submit(_charge(server, cost=15), runner="charge", max_attempts=1)
    await collect(stack.client, reply.run.run_id)
    run = await _settled(stack, reply.run.run_id)
    budget = await stack.client.budget()

    assert [(e.key, e.state) for e in run.effects] == [("charge", "failed")], run.effects
    assert "never performed" in (run.effects[0].error or "")
    assert not server.charges
    assert (budget.cost_used, budget.cost_reserved) == (0, 0)


@pytest.mark.parametrize("charging", [500], indirect=True, ids=["claims of 500 ms"])
async def test_an_operator_resolves_an_effect_failed_by_its_deadline(
    charging: tuple[EffectServer, InProcessStack],
) -> None:
    server, stack = charging
    server.hold = True  # each charge is performed, but never answered within 500 ms
    runs = []
    for _ in range(2):
        reply = await stack.client.submit(_charge(server, cost=20), runner="charge")
        await collect(stack.client, reply.run.run_id)
        runs.append(await stack.client.get(reply.run.run_id))
    charged = await stack.client.budget()
    # The operator learns that the first did not happen, and that the second did.
    not_done = await stack.client.resolve_effect(runs[0].run_id, "charge", error="refunded")
    after_refund = await stack.client.budget()
    done = await stack.client.resolve_effect(runs[1].run_id, "charge", receipt={"id": "ch_2"})
    final = await stack.client.budget()

    for run in runs:
        assert run.error is not None
        assert run.error.code == ErrorCode.EFFECT_DEADLINE_EXCEEDED
    # Failed by its deadline, it may have happened: charged until the operator says.
    assert (charged.cost_used, charged.cost_reserved) == (40, 0)
    assert [(e.state, e.error) for e in not_done.effects] == [("failed", "refunded")]
    assert after_refund.cost_used == 20
    assert [(e.state, e.receipt_id) for e in done.effects] == [("reconciled", "ch_2")]
    assert final.cost_used == 20


async def test_a_reconcile_that_fails_is_retried_never_shown_as_a_tools_error(
    infra: Any, db_url: str, prefix: str
) -> None:
    async with EffectServer() as server:
        MAIL_API.update(url=server.url, status="yes")
        try:
            async with InProcessStack(
                infra.nats_url,
                db_url,
                prefix,
                runners={"mailer": mailer},
                tools={"send_email": send_email},
            ) as stack:
                await stack.allow_effects("http")
                # Sent, but its answer lost; then the first reconcile's connection drops.
                server.lose_answers = 1
                server.drop_status = 1
                script = {"to": "ada@example.com", "calls": ["welcome"]}
                reply = await stack.client.submit(script, runner="mailer", max_attempts=4)
                frames, transcript = await collect(stack.client, reply.run.run_id)
                run = await stack.client.get(reply.run.run_id)
        finally:
            MAIL_API.update(status="")

    assert (run.status, run.attempts) == (RunStatus.FINISHED, 3)
    assert transcript.text == "em_1"
    assert list(server.emails.values()) == [1]
    assert [(e.key, e.state) for e in run.effects] == [("welcome:email", "reconciled")]
    # The tool's call never came back as "not sent".
    results = [f.data for f in frames if f.type == FrameType.TOOL_RESULT]
    assert [r["error"] for r in results] == [None]
