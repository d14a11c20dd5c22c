"""Retention: an ended run leaves the client frames stream after a grace (Postgres has
all its frames by then), and its segments leave Postgres after the frame retention (its
row, with the result, stays)."""

from runwire.runtime.broker import Broker
from runwire.runtime.settings import RecoverySettings
from runwire.runtime.store import Store


class Retention:
    """The duty that purges ended runs' frames from the stream, then from Postgres."""

    name = "retention"

    def __init__(self, settings: RecoverySettings, store: Store, broker: Broker) -> None:
        self.settings = settings
        self.store = store
        self.broker = broker

    async def run(self) -> dict[str, int]:
        s, subjects = self.settings, self.broker.subjects
        grace = s.stream_purge_grace.total_seconds()
        purged = await self.store.purge_due(grace, s.batch_size)
        for run_id, tenant in purged:
            # Marked first: a purge that fails now leaves frames in the stream until
            # its max age, which is harmless, while Postgres already has them all.
            await self.broker.purge_subject(
                subjects.run_frames_stream, subjects.run_frames(tenant, run_id)
            )
        expired = await self.store.expire_frames(s.frame_retention.total_seconds(), s.batch_size)
        return {"purged": len(purged), "expired": len(expired)}
