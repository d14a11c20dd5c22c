"""Session turns that come with time: a canceled run that is still running stops holding
its session once its grace has passed, and the next run of the session gets its job.
(When a run of a session ends, the same write gives the next run its job; this duty is
only for the grace.)"""

from runwire.recovery.decisions import ACTOR
from runwire.runtime.settings import RecoverySettings
from runwire.runtime.store import Store


class SessionTurns:
    """The duty that starts the turns of sessions held past a cancel's grace."""

    name = "session turns"

    def __init__(self, settings: RecoverySettings, store: Store) -> None:
        self.settings = settings
        self.store = store

    async def run(self) -> dict[str, int]:
        # Their jobs are the outbox's (due at once, written by this statement): the sweep
        # publishes them on its next pass.
        return {"started": await self.store.start_session_turns(self.settings.batch_size, ACTOR)}
