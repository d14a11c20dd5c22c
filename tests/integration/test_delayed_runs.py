"""Delayed runs: a run submitted to start later waits without a job and without a share
of executor slots, is visible, cancelable and reschedulable, and starts once due."""

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from runwire import ClientError
from runwire.contracts.errors import ErrorCode
from runwire.contracts.frames import FrameType
from runwire.contracts.status import RunStatus
from tests.services import InProcessStack, collect

pytestmark = pytest.mark.integration

QUICK = {"tokens": ["ok"]}
HOUR_MS = 3_600_000


async def _claimed_after_s(stack: InProcessStack, run_id: str) -> float:
    events = await stack.store.run_events(run_id)
    at = {e["event"]: e["at"] for e in reversed(events)}
    return float((at["claimed"] - at["submitted"]).total_seconds())


async def test_a_delayed_run_starts_once_due_and_holds_no_share_meanwhile(
    infra: Any, db_url: str, prefix: str
) -> None:
    # A share of one job: a delayed run holding it would keep the quick run waiting.
    overrides = {"tenant_share_runs": 1}
    async with InProcessStack(
        infra.nats_url, db_url, prefix, db_roles=infra.service_roles, overrides=overrides
    ) as stack:
        client = stack.client
        later = (await client.submit(QUICK, delay_ms=HOUR_MS)).run.run_id
        soon = (await client.submit(QUICK, delay_ms=1_500)).run.run_id
        now = (await client.submit(QUICK)).run.run_id
        _, done_now = await collect(client, now)
        shown = await client.get(later)
        assert (shown.status, shown.queued_for) == (RunStatus.QUEUED, "time")
        assert shown.not_before is not None
        assert shown.not_before - shown.created_at > timedelta(minutes=59)
        frames, _ = await collect(client, soon)
        waited = await _claimed_after_s(stack, soon)
        budget = await client.budget()
        # Canceled while it waits: it ends, never attempted.
        canceled = await client.cancel(later)
        frames_later, _ = await collect(client, later)
    assert done_now.text == "ok"
    assert frames[-1].type == FrameType.DONE
    assert 1.4 <= waited < 10, waited
    assert (budget.issued_runs, budget.queued_runs) == (0, 1)  # the hour's run, no job
    assert canceled.status == RunStatus.CANCELED
    assert [f.type for f in frames_later] == [FrameType.DONE]


async def test_a_delayed_run_is_rescheduled_and_a_started_one_is_not(
    infra: Any, db_url: str, prefix: str
) -> None:
    async with InProcessStack(
        infra.nats_url, db_url, prefix, db_roles=infra.service_roles
    ) as stack:
        client = stack.client
        run_id = (await client.submit(QUICK, delay_ms=HOUR_MS)).run.run_id
        tomorrow = datetime.now(UTC) + timedelta(days=1)
        moved = await client.reschedule(run_id, not_before=tomorrow)
        assert moved.not_before == tomorrow
        assert (moved.status, moved.queued_for) == (RunStatus.QUEUED, "time")
        # Now: it starts at once.
        started = await client.reschedule(run_id, delay_ms=0)
        assert started.not_before is None or started.not_before <= datetime.now(UTC)
        _, transcript = await collect(client, run_id)
        assert transcript.text == "ok"
        with pytest.raises(ClientError) as refused:
            await client.reschedule(run_id, delay_ms=1000)
        events = [e["event"] for e in await stack.store.run_events(run_id)]
    assert (refused.value.code, refused.value.retryable) == (ErrorCode.NOT_RESCHEDULABLE, False)
    assert "finished" in refused.value.message
    assert events[:4] == ["submitted", "rescheduled", "rescheduled", "share_turn"]


async def test_rescheduling_no_run_is_not_found(stack: InProcessStack) -> None:
    with pytest.raises(ClientError) as unknown:
        await stack.client.reschedule("no-such-run", delay_ms=10)
    assert (unknown.value.code, unknown.value.retryable) == (ErrorCode.NOT_FOUND, False)
