"""Run events: every transition recorded in `run_events` is published after its commit.

`run_events` is the outbox. One recovery replica at a time takes the oldest rows (an
advisory lock; the others skip their turn), so a run's events are published in the
order of its transitions; each with the row id as `Nats-Msg-Id` (a repeat after a crash
is stored once), then marked published.
"""

import asyncio
import logging
from typing import Any

from contracts.events import RunEvent
from services.runtime.broker import Broker
from services.runtime.errors import RunwireError
from services.runtime.store import Store

log = logging.getLogger(__name__)

BATCH = 500


class EventPublisher:
    """Publishes the outbox of run events."""

    def __init__(self, store: Store, broker: Broker) -> None:
        self.store = store
        self.broker = broker

    async def publish_pending(self) -> int:
        """Publish what is waiting; returns how many events were published.

        The batch's publishes are sent at once (one connection keeps them in order) and
        their acknowledgements awaited in order: the rows up to the first failure are
        marked published, the rest are taken again by the next call."""
        async with self.store.unpublished_events(BATCH) as batch:
            sends = [
                asyncio.ensure_future(
                    self.broker.publish_event(
                        row["tenant"], _event(row), row["id"], traceparent=row["trace_parent"]
                    )
                )
                for row in batch.events
            ]
            failed = False
            for row, sent in zip(batch.events, sends, strict=True):
                try:
                    await sent
                except RunwireError as exc:
                    if not failed:
                        log.warning("run events not published yet: %s", exc.message)
                    failed = True
                if not failed:
                    batch.published.append(row["id"])
        return len(batch.published)


def _event(row: dict[str, Any]) -> RunEvent:
    return RunEvent(
        run_id=row["run_id"],
        session_id=row["session_id"],
        event=row["event"],
        status=row["status"],
        attempt=row["attempt"],
        code=row["code"],
        at=row["at"],
    )
