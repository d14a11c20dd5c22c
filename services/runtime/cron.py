"""When a schedule fires: its cron expression (five fields, or six with seconds first)
read in its time zone, daylight saving time included (a time that does not exist that day
fires at the first one that does), as instants in UTC."""

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError


def check(expr: str, tz: str) -> str | None:
    """What is wrong with the expression or the time zone (None: nothing)."""
    try:
        zone = ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        return f"unknown time zone {tz!r} (an IANA name: Europe/Oslo, UTC)"
    try:
        CronSim(expr, datetime.now(zone))
    except CronSimError as exc:
        return f"not a cron expression: {exc}"
    return None


def fires(expr: str, tz: str, after: datetime, until: datetime, limit: int) -> list[datetime]:
    """The fire times after `after` and at or before `until`, the first `limit` of them."""
    found: list[datetime] = []
    for at in CronSim(expr, after.astimezone(ZoneInfo(tz))):
        at = at.astimezone(UTC)
        if at > until or len(found) == limit:
            break
        found.append(at)
    return found


def next_fire(expr: str, tz: str, after: datetime) -> datetime:
    """The first fire time after `after`."""
    return next(iter(CronSim(expr, after.astimezone(ZoneInfo(tz))))).astimezone(UTC)


def latest_fire(expr: str, tz: str, at: datetime) -> datetime:
    """The last fire time at or before `at`."""
    moment = (at + timedelta(microseconds=1)).astimezone(ZoneInfo(tz))
    return next(iter(CronSim(expr, moment, reverse=True))).astimezone(UTC)
