"""Schedules that fire: each due schedule's fires become runs (runwire.runtime.cron says
when), in one transaction with its next fire, the schedule's row locked so that one
replica fires it; each fire's run has a request id of its own, so a fire is made once
whatever replica, restart or backfill meets it again. After an outage the fires missed
within the schedule's catch-up window run, and the latest missed one always does; the
others are counted as skipped."""

from datetime import UTC, datetime, timedelta
from typing import Any

from runwire.recovery.decisions import ACTOR
from runwire.runtime import cron, faults
from runwire.runtime.settings import RecoverySettings
from runwire.runtime.store import Store

# Fires of one schedule made in one tick at most (the latest ones of its window), and the
# most fires counted as skipped at once.
MAX_FIRES = 1000
MAX_COUNTED = 100_000
MOMENT = timedelta(microseconds=1)


def plan(schedule: dict[str, Any], now: datetime) -> tuple[list[datetime], datetime, int]:
    """Which fires of a due schedule to make now (those of its catch-up window, the
    latest missed one always), its next fire, and how many it skips."""
    expr, tz, first = schedule["cron"], schedule["tz"], schedule["next_fire_at"]
    oldest = max(first, now - timedelta(seconds=schedule["catch_up_s"]))
    kept = cron.fires(expr, tz, oldest - MOMENT, now, MAX_COUNTED)[-MAX_FIRES:]
    if not kept:
        kept = [cron.latest_fire(expr, tz, now)]
    skipped = len(cron.fires(expr, tz, first - MOMENT, kept[0] - MOMENT, MAX_COUNTED))
    return kept, cron.next_fire(expr, tz, now), skipped


class ScheduleFires:
    """The duty that fires due schedules."""

    name = "schedules"

    def __init__(self, settings: RecoverySettings, store: Store) -> None:
        self.settings = settings
        self.store = store

    async def run(self) -> dict[str, int]:
        # Their jobs are the outbox's (due at once): the sweep publishes them.
        now = datetime.now(UTC)
        fired, made = await self.store.fire_due_schedules(
            self.settings.batch_size, lambda s: plan(s, now), ACTOR
        )
        if made:
            await faults.point(faults.SCHEDULE_FIRED)
        return {"schedules_fired": fired, "scheduled_runs": made}
