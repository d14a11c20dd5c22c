"""When schedules fire: cron expressions in a time zone, and what a due schedule makes
after an outage (its catch-up window)."""

from datetime import UTC, datetime, timedelta

import pytest

from runwire.recovery.schedules import plan
from runwire.runtime import cron

pytestmark = pytest.mark.unit


def test_a_time_that_does_not_exist_that_day_fires_at_the_first_that_does() -> None:
    after = datetime(2026, 3, 28, 12, tzinfo=UTC)
    fires = cron.fires("30 2 * * *", "Europe/Oslo", after, after + timedelta(days=3), 10)
    # 02:30 Oslo: 01:30 UTC in winter; on 29 March the clocks skip 02:00-03:00 (03:00 CEST
    # is 01:00 UTC); after it, 00:30 UTC.
    assert fires == [
        datetime(2026, 3, 29, 1, 0, tzinfo=UTC),
        datetime(2026, 3, 30, 0, 30, tzinfo=UTC),
        datetime(2026, 3, 31, 0, 30, tzinfo=UTC),
    ]


def test_bad_expressions_and_zones_are_named() -> None:
    assert cron.check("0 9 * * 1-5", "Europe/Oslo") is None
    assert cron.check("* * * * * *", "UTC") is None  # seconds first
    assert "cron" in str(cron.check("61 * * * *", "UTC"))
    assert "time zone" in str(cron.check("0 9 * * *", "Mars/Olympus"))


def test_after_an_outage_the_fires_within_the_window_run_and_the_latest_always_does() -> None:
    now = datetime(2026, 1, 1, 12, 0, 10, tzinfo=UTC)
    due = {"cron": "* * * * * *", "tz": "UTC", "next_fire_at": now - timedelta(seconds=10)}
    kept, next_at, skipped = plan({**due, "catch_up_s": 3}, now)
    assert kept == [now - timedelta(seconds=s) for s in (3, 2, 1, 0)]
    assert (next_at, skipped) == (now + timedelta(seconds=1), 7)
    kept, _, skipped = plan({**due, "catch_up_s": 0, "next_fire_at": now - timedelta(hours=1)}, now)
    assert (kept, skipped) == ([now], 3600)
