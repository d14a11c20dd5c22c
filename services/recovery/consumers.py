"""Tenants' consumers held to the rules, behind the submitter's check.

A tenant creates JetStream consumers on its own runs' frames and events through its
own API prefix (`<prefix>.<tenant>.JS.API`), which the submitter answers: it refuses a
durable, acknowledged or long-lived consumer, and one delivering outside the tenant's
inbox, before the server sees it (services/submitter/jetstream.py). What it cannot see is
how many a tenant holds across the submitter's replicas, and a consumer made some other
way (an identity with wider rights, a rule of the broker loosened later): so recovery
watches the server's advisories of consumers created and removes at once any consumer
of a tenant that:

- is durable (a tenant's consumers are ephemeral, and go when their client stops);
- outlives its client longer than `tenant_consumer_max_inactive_ms`;
- delivers outside the tenant's inbox (`_INBOX_<tenant>.` or NATS's default `_INBOX.`);
- is acknowledged and may be delivered more than `tenant_consumer_max_deliver` times
  (or without end);
- is one more than `tenant_max_consumers` of the tenant's on that stream, once no
  room can be made: a push consumer no client subscribes to any more (its client
  stopped reading; the server removes it after its inactive threshold) goes first, so
  that what a tenant's clients left behind never cuts off one they are reading.

Every `consumer_sweep_ms` it also lists the streams' consumers, to count them afresh and
catch what an advisory missed (one lost, or sent while no replica listened). Every
replica listens (no queue group): each counts every consumer, and a second removal of
the same consumer finds it gone. A consumer filtered to every tenant (`*`), the
operator's or a service's, is not a tenant's and is left alone.
"""

import asyncio
import contextlib
import json
import logging
from collections import defaultdict
from dataclasses import dataclass

from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, ConsumerInfo

from runwire.contracts.subjects import Subjects, reply_inboxes, valid_tenant
from runwire.runtime.broker import Broker
from runwire.runtime.errors import RunwireError
from runwire.runtime.logs import fields
from runwire.runtime.settings import RecoverySettings

log = logging.getLogger(__name__)

ADVISORY = "$JS.EVENT.ADVISORY.CONSUMER"
# Over the limit, how many of a tenant's oldest consumers are looked at for one its
# client no longer reads, before the newest is removed instead.
ROOM_CHECKS = 4


@dataclass(frozen=True)
class ConsumerRules:
    """What a tenant's consumer may be (see the module)."""

    max_per_tenant: int
    max_inactive_s: float
    max_deliver: int

    @classmethod
    def of(cls, settings: RecoverySettings) -> "ConsumerRules":
        return cls(
            settings.tenant_max_consumers,
            settings.tenant_consumer_max_inactive_ms / 1000,
            settings.tenant_consumer_max_deliver,
        )


def tenant_of(config: ConsumerConfig, subjects: Subjects) -> str | None:
    """The tenant whose runs a consumer reads; None when it is not one tenant's (a
    filter of every tenant, or none)."""
    filters = [config.filter_subject] if config.filter_subject else []
    filters += config.filter_subjects or []
    tenants = set()
    for subject in filters:
        tokens = subject.split(".")
        if len(tokens) < 3 or tokens[0] != subjects.prefix or not valid_tenant(tokens[1]):
            return None
        tenants.add(tokens[1])
    return tenants.pop() if len(tenants) == 1 else None


def broken_rule(config: ConsumerConfig, tenant: str, rules: ConsumerRules) -> str | None:
    """Which rule a tenant's consumer breaks (what a log says), or None."""
    if config.durable_name:
        return "it is durable"
    if config.inactive_threshold is not None and config.inactive_threshold > rules.max_inactive_s:
        return f"it outlives its client {config.inactive_threshold:.0f}s"
    if config.deliver_subject and not config.deliver_subject.startswith(reply_inboxes(tenant)):
        return "it delivers outside the tenant's inbox"
    if config.ack_policy not in (None, AckPolicy.NONE) and not (
        config.max_deliver is not None and 0 < config.max_deliver <= rules.max_deliver
    ):
        return f"it may be delivered more than {rules.max_deliver} times"
    return None


def unread(info: ConsumerInfo) -> bool:
    """A push consumer no client subscribes to: its client stopped reading (a client
    that follows a run leaves its consumer behind until the server removes it, after
    its inactive threshold)."""
    return bool(info.config.deliver_subject) and not info.push_bound


class TenantConsumers:
    """The watch over tenants' consumers of the frames and events streams."""

    name = "tenant_consumers"

    def __init__(self, settings: RecoverySettings, broker: Broker) -> None:
        self.settings = settings
        self.broker = broker
        self.rules = ConsumerRules.of(settings)
        subjects = broker.subjects
        self.streams = (subjects.run_frames_stream, subjects.events_stream)
        # The consumers of each tenant on each stream that keep the rules, as counted,
        # the oldest first (as far as this replica knows: see `_make_room`).
        self._known: dict[tuple[str, str], dict[str, None]] = defaultdict(dict)

    async def watch(self, stop: asyncio.Event) -> None:
        """Act on the advisories and sweep every `consumer_sweep_ms` until `stop`."""
        for stream in self.streams:
            await self.broker.subscribe(f"{ADVISORY}.CREATED.{stream}.*", self._created)
            await self.broker.subscribe(f"{ADVISORY}.DELETED.{stream}.*", self._deleted)
        while not stop.is_set():
            try:
                removed = await self.sweep()
            except RunwireError as exc:
                log.warning("tenants' consumers not looked at: %s", exc.message)
            else:
                if removed:
                    log.info("tenants' consumers swept", extra=fields(removed=removed))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.consumer_sweep_ms / 1000)

    async def sweep(self) -> int:
        """Look at every consumer of the streams; how many were removed."""
        removed = 0
        for stream in self.streams:
            known: dict[tuple[str, str], dict[str, None]] = defaultdict(dict)
            consumers = sorted(await self.broker.consumers_of(stream), key=_created_at)
            for info in consumers:
                if await self._judge(stream, info, known):
                    removed += 1
            for key in [k for k in self._known if k[0] == stream]:
                del self._known[key]
            self._known.update(known)
        return removed

    async def _judge(
        self, stream: str, info: ConsumerInfo, known: dict[tuple[str, str], dict[str, None]]
    ) -> bool:
        """Remove the consumer if it breaks a rule (counting it against `known`);
        whether it was removed."""
        config = info.config
        tenant = tenant_of(config, self.broker.subjects)
        if tenant is None:
            return False
        mine = known[(stream, tenant)]
        why = broken_rule(config, tenant, self.rules)
        if (
            why is None
            and info.name not in mine
            and len(mine) >= self.rules.max_per_tenant
            and not await self._make_room(stream, tenant, mine)
        ):
            why = f"the tenant has {len(mine)} consumers of the stream already"
        if why is None:
            mine.setdefault(info.name)
            return False
        mine.pop(info.name, None)
        log.warning(
            "a tenant's consumer removed: %s",
            why,
            extra=fields(tenant=tenant, stream=stream, consumer=info.name),
        )
        await self.broker.delete_consumer(stream, info.name)
        return True

    async def _make_room(self, stream: str, tenant: str, mine: dict[str, None]) -> bool:
        """Remove the oldest of the tenant's consumers that its client no longer reads,
        looking at ROOM_CHECKS at most; whether there is room now. One still read goes
        to the back of `mine`, so that the next look starts with others."""
        for name in list(mine)[:ROOM_CHECKS]:
            info = await self.broker.consumer_of(stream, name)
            mine.pop(name, None)
            if info is None:
                return True  # gone already
            if unread(info):
                log.info(
                    "a tenant's consumer no client reads removed to make room",
                    extra=fields(tenant=tenant, stream=stream, consumer=name),
                )
                await self.broker.delete_consumer(stream, name)
                return True
            mine[name] = None
        return False

    async def _created(self, msg: Msg) -> None:
        stream, name = _stream_and_consumer(msg)
        try:
            info = await self.broker.consumer_of(stream, name)
            if info is not None:
                await self._judge(stream, info, self._known)
        except RunwireError as exc:
            log.warning("a consumer created was not looked at (the sweep will): %s", exc)

    async def _deleted(self, msg: Msg) -> None:
        stream, name = _stream_and_consumer(msg)
        for (of_stream, _), names in self._known.items():
            if of_stream == stream:
                names.pop(name, None)


def _stream_and_consumer(msg: Msg) -> tuple[str, str]:
    """The stream and the consumer an advisory is about (the subject's last tokens)."""
    try:
        body = json.loads(msg.data)
        return str(body["stream"]), str(body["consumer"])
    except (ValueError, KeyError, TypeError):
        tokens = msg.subject.split(".")
        return tokens[-2], tokens[-1]


def _created_at(info: ConsumerInfo) -> str:
    return str(info.created or "")
