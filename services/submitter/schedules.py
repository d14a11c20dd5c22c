"""A tenant's schedules: created, replaced, paused, removed, listed and backfilled here;
fired by recovery (runwire.recovery.schedules)."""

import logging
from datetime import UTC, datetime, timedelta

from runwire.contracts import commands, replies
from runwire.runtime import cron
from runwire.runtime.errors import InvalidRequest, NotFound
from runwire.runtime.logs import fields
from runwire.runtime.outbox import Outbox
from runwire.runtime.settings import SubmitterSettings
from runwire.runtime.store import Store

log = logging.getLogger(__name__)

ACTOR = "submitter"
# Fires one backfill makes at most.
MAX_BACKFILL = 1000


class Schedules:
    """The schedule commands."""

    def __init__(self, settings: SubmitterSettings, store: Store, outbox: Outbox) -> None:
        self.settings = settings
        self.store = store
        self.outbox = outbox

    async def set(self, tenant: str, cmd: commands.SetScheduleCommand) -> replies.SchedulesReply:
        wrong = cron.check(cmd.cron, cmd.tz)
        if wrong is not None:
            raise InvalidRequest(wrong)
        schedule = cmd.model_dump(mode="json", exclude={"v"})
        schedule["max_attempts"] = self.settings.default_max_attempts
        schedule["attempt_timeout_ms"] = self.settings.default_attempt_timeout_ms
        schedule["next_fire_at"] = cron.next_fire(cmd.cron, cmd.tz, datetime.now(UTC))
        await self.store.set_schedule(tenant, schedule)
        log.info("schedule set", extra=fields(tenant=tenant, schedule=cmd.name, paused=cmd.paused))
        return await self.list(tenant)

    async def remove(
        self, tenant: str, cmd: commands.RemoveScheduleCommand
    ) -> replies.SchedulesReply:
        if not await self.store.remove_schedule(tenant, cmd.name):
            raise NotFound(f"no schedule {cmd.name!r}")
        return await self.list(tenant)

    async def list(self, tenant: str, made: int = 0) -> replies.SchedulesReply:
        found = await self.store.schedules_of(tenant)
        return replies.SchedulesReply(
            tenant=tenant,
            schedules=[replies.ScheduleData.model_validate(s) for s in found],
            made=made,
        )

    async def backfill(
        self, tenant: str, cmd: commands.BackfillScheduleCommand
    ) -> replies.SchedulesReply:
        found = await self.store.schedules_of(tenant, cmd.name)
        if not found:
            raise NotFound(f"no schedule {cmd.name!r}")
        schedule = found[0]
        if cmd.end < cmd.start or cmd.end > datetime.now(UTC):
            raise InvalidRequest("backfill a time range that has passed: start <= end <= now")
        # A fire at `start` itself counts: the fires after a moment before it.
        before = cmd.start - timedelta(microseconds=1)
        fires = cron.fires(schedule["cron"], schedule["tz"], before, cmd.end, MAX_BACKFILL + 1)
        if len(fires) > MAX_BACKFILL:
            raise InvalidRequest(f"{cmd.name} fires more than {MAX_BACKFILL} times in that range")
        made, xact = await self.store.backfill_schedule(tenant, cmd.name, fires, ACTOR)
        await self.outbox.dispatch_xact(xact)
        log.info("schedule backfilled", extra=fields(tenant=tenant, schedule=cmd.name, made=made))
        return await self.list(tenant, made)
