"""An executor's presence in Postgres: a session advisory lock on a connection of its own,
whose key each of its claims records. When the executor's process dies, Postgres ends
that session and frees the lock at once, and recovery takes the executor's runs over then
instead of when their leases run out. A frozen executor keeps its session (and its runs,
until their leases run out): only a process that is gone loses its presence."""

import asyncio
import contextlib
import logging
import random

from runwire.runtime.errors import RunwireError
from runwire.runtime.logs import fields
from runwire.runtime.store import EXECUTOR_PRESENCE_LOCKS, LockSession

log = logging.getLogger(__name__)


class Presence:
    """Holds the executor's presence lock, and takes it again after losing its session."""

    def __init__(self, dsn: str, every_s: float) -> None:
        self._dsn = dsn
        self._every_s = every_s
        self.key = random.randrange(1, 2**31 - 1)
        self._session: LockSession | None = None

    @property
    def held(self) -> int | None:
        """The lock's key while it is held (claims record it), else None: a claim made
        while the lock is not held waits for its lease alone."""
        session = self._session
        return self.key if session is not None and session.open else None

    async def hold(self) -> None:
        """Take the lock (a new key if another executor holds this one), or check that it
        is still held; on a failure it is not held until the next call succeeds."""
        try:
            if self._session is None:
                session = await LockSession.connect(self._dsn)
                while not await session.try_lock(EXECUTOR_PRESENCE_LOCKS, self.key):
                    self.key = random.randrange(1, 2**31 - 1)
                self._session = session
                log.info("executor presence held", extra=fields(presence=self.key))
            else:
                await self._session.ping()
        except RunwireError as exc:
            if self._session is not None:
                log.warning(
                    "executor presence lost (%s): runs claimed from now on wait for their "
                    "lease alone until it is back",
                    exc.message,
                )
            await self.close()

    async def run(self, stop: asyncio.Event) -> None:
        """Keep the lock until `stop` (then the caller closes it, after draining)."""
        while not stop.is_set():
            await self.hold()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._every_s)

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()
