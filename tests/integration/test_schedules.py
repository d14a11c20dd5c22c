"""Schedules: each fire starts exactly one run, across two recovery replicas and a
restart of recovery; overlap policies; pause; backfill makes each past fire once."""

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from runwire import ClientError
from runwire.contracts.errors import ErrorCode
from runwire.testing.waiting import fault_window, pace
from tests.services import InProcessStack, eventually

pytestmark = pytest.mark.integration

EVERY_SECOND = "* * * * * *"
QUICK = {"tokens": ["tick"]}


async def _runs_of(stack: InProcessStack, name: str) -> list[dict[str, Any]]:
    """The runs the schedule made: their fire time and status, by fire time."""
    rows = await stack.store._pool.fetch(
        "SELECT metadata->>'fire_at' AS fire_at, status::text AS status FROM runs"
        " WHERE metadata->>'schedule' = $1 ORDER BY 1",
        name,
    )
    return [dict(r) for r in rows]


async def test_each_fire_runs_once_across_replicas_and_a_restart_of_recovery(
    infra: Any, db_url: str, prefix: str
) -> None:
    async with InProcessStack(
        infra.nats_url, db_url, prefix, db_roles=infra.service_roles
    ) as stack:
        stack.start_recovery("recovery-2")  # two replicas race for every fire
        made = await stack.client.set_schedule(
            "tick", EVERY_SECOND, input=QUICK, overlap="allow", catch_up_s=60
        )
        assert [s.name for s in made.schedules] == ["tick"]
        await eventually(lambda: _at_least(stack, "tick", 3), timeout=20)
        # Recovery gone for a while (both replicas), then back: the fires it missed
        # within the catch-up window are made, once each.
        await stack.stop_service("recovery")
        await stack.stop_service("recovery-2")
        stopped_at = datetime.now(UTC)
        await fault_window(2.5, "recovery down: fires are missed")
        stack.start_recovery("recovery")
        await eventually(lambda: _past(stack, "tick", stopped_at + timedelta(seconds=3)), 20)
        await stack.client.set_schedule("tick", EVERY_SECOND, input=QUICK, paused=True)
        runs = await _runs_of(stack, "tick")
        shown = (await stack.client.schedules()).schedules[0]
    fires = [datetime.fromisoformat(r["fire_at"]) for r in runs]
    assert len(fires) == len(set(fires))  # each fire once
    seconds = {int(f.timestamp()) for f in fires}
    # No second missing between the first fire and the last: the outage's were caught up.
    assert seconds == set(range(min(seconds), max(seconds) + 1))
    assert (shown.paused, shown.next_fire_at, shown.fired) == (True, None, len(fires))


async def _at_least(stack: InProcessStack, name: str, count: int) -> bool:
    return len(await _runs_of(stack, name)) >= count


async def _past(stack: InProcessStack, name: str, at: datetime) -> bool:
    runs = await _runs_of(stack, name)
    return bool(runs) and datetime.fromisoformat(runs[-1]["fire_at"]) >= at


async def test_overlap_skip_makes_no_run_while_one_is_active_and_backfill_makes_each_fire_once(
    stack: InProcessStack,
) -> None:
    slow = {"tokens": ["slow"], "token_delay_ms": 2500}
    await stack.client.set_schedule("slow", EVERY_SECOND, input=slow, overlap="skip")
    await eventually(lambda: _skipped(stack, "slow"), timeout=20)
    await stack.client.set_schedule("slow", EVERY_SECOND, input=slow, paused=True)
    runs = await _runs_of(stack, "slow")
    # One at a time: a second run only once the first ended.
    assert sum(r["status"] in ("queued", "running") for r in runs) <= 1

    await stack.client.set_schedule(
        "daily", "0 9 * * *", tz="Europe/Oslo", input=QUICK, overlap="buffer"
    )
    start = datetime(2026, 3, 27, tzinfo=UTC)
    end = datetime(2026, 3, 31, tzinfo=UTC)
    first = await stack.client.backfill_schedule("daily", start, end)
    again = await stack.client.backfill_schedule("daily", start, end)
    fires = [r["fire_at"] for r in await _runs_of(stack, "daily")]
    assert (first.made, again.made) == (4, 0)
    # 09:00 in Oslo: 08:00 UTC before the clocks went forward on 29 March, 07:00 after.
    assert fires == [
        "2026-03-27T08:00:00.000000Z",
        "2026-03-28T08:00:00.000000Z",
        "2026-03-29T07:00:00.000000Z",
        "2026-03-30T07:00:00.000000Z",
    ]
    for bad in (
        {"cron": "61 * * * *"},
        {"cron": "0 9 * * *", "tz": "Mars/Olympus"},
    ):
        with pytest.raises(ClientError) as refused:
            await stack.client.set_schedule("bad", **bad)  # type: ignore[arg-type]
        assert (refused.value.code, refused.value.retryable) == (ErrorCode.INVALID_REQUEST, False)
    with pytest.raises(ClientError) as future:
        await stack.client.backfill_schedule("daily", start, datetime.now(UTC) + timedelta(days=1))
    assert future.value.code == ErrorCode.INVALID_REQUEST


async def _skipped(stack: InProcessStack, name: str) -> bool:
    (shown,) = [s for s in (await stack.client.schedules()).schedules if s.name == name]
    return shown.skipped >= 2 and shown.fired >= 1


async def test_an_ended_tenants_schedules_start_no_run(stack: InProcessStack) -> None:
    await stack.client.set_schedule("tick", EVERY_SECOND, input=QUICK, overlap="allow")
    await eventually(lambda: _at_least(stack, "tick", 1), timeout=20)
    await stack.client.end_tenant()
    (shown,) = (await stack.client.schedules()).schedules
    made = len(await _runs_of(stack, "tick"))
    await pace(2.5, "fires that would have come")
    assert shown.paused
    assert len(await _runs_of(stack, "tick")) == made
