"""Turns that come with time. A canceled run that is still running stops holding its
session once its grace has passed, and the next run of the session gets its job. A
tenant's runs waiting for its share get theirs where the share has room although no run
of the tenant ended (its last runs ended while another was being submitted, or an
operator raised its share). (When a run ends, the same write gives the next runs their
job; this duty is only for what no end tells.)"""

from runwire.recovery.decisions import ACTOR
from runwire.runtime.settings import RecoverySettings
from runwire.runtime.store import Store


class SessionTurns:
    """The duty that starts the turns of sessions held past a cancel's grace."""

    name = "session and share turns"

    def __init__(self, settings: RecoverySettings, store: Store) -> None:
        self.settings = settings
        self.store = store

    async def run(self) -> dict[str, int]:
        # Their jobs are the outbox's (due at once, written by these statements): the
        # sweep publishes them on its next pass.
        limit = self.settings.batch_size
        return {
            "started": await self.store.start_session_turns(limit, ACTOR),
            "shares": await self.store.start_share_turns(limit, ACTOR),
        }
