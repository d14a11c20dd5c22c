"""An executor's presence in Postgres: a session advisory lock on a connection of its own,
whose key each of its claims records. When the executor's process dies, Postgres ends
that session and frees the lock at once, and recovery takes the executor's runs over then
instead of when their leases run out. A frozen executor keeps its session (and its runs,
until their leases run out): only a process that is gone loses its presence."""

import asyncio
import contextlib
import logging
import random

from runwire.runtime.logs import fields
from runwire.runtime.store import EXECUTOR_PRESENCE_LOCKS, KeptLockSession, LockSession

log = logging.getLogger(__name__)


class Presence:
    """Holds the executor's presence lock, and takes it again after losing its session."""

    def __init__(self, dsn: str, every_s: float) -> None:
        self._every_s = every_s
        self.key = random.randrange(1, 2**31 - 1)
        self._kept = KeptLockSession(dsn, self._take)

    @property
    def held(self) -> int | None:
        """The lock's key while it is held (claims record it), else None: a claim made
        while the lock is not held waits for its lease alone."""
        session = self._kept.session
        return self.key if session is not None and session.open else None

    async def _take(self, session: LockSession) -> None:
        while not await session.try_lock(EXECUTOR_PRESENCE_LOCKS, self.key):
            self.key = random.randrange(1, 2**31 - 1)  # another executor's key
        log.info("executor presence held", extra=fields(presence=self.key))

    async def hold(self) -> None:
        """Take the lock, or check that it is still held; on a failure it is not held
        until a later call succeeds."""
        was_held = self._kept.session is not None
        failed = await self._kept.check()
        if failed is not None and was_held:
            log.warning(
                "executor presence lost (%s): runs claimed from now on wait for their "
                "lease alone until it is back",
                failed.message,
            )

    async def run(self, stop: asyncio.Event) -> None:
        """Keep the lock until `stop` (then the caller closes it, after draining)."""
        while not stop.is_set():
            await self.hold()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._every_s)

    async def close(self) -> None:
        await self._kept.close()
