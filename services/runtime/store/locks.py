"""Session-level advisory locks on a connection of their own (relay partitions, relay
and executor presence)."""

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from runwire.runtime.errors import RunwireError, Unavailable
from runwire.runtime.store.queries import UNAVAILABLE
from runwire.runtime.store.schema import QUERIES

log = logging.getLogger(__name__)

LOCK_TIMEOUT_S = 5.0
# What a lock connection raises when Postgres or the connection goes away (or a query
# of it fails or takes too long): the session and its locks are taken for gone.
CONNECTION_ERRORS = (*UNAVAILABLE, TimeoutError, asyncpg.PostgresError)
# The class of executors' presence locks (a key per executor, recorded by its claims).
EXECUTOR_PRESENCE_LOCKS = 72_401_133


class LockSession:
    """Session-level advisory locks held on one dedicated connection.

    A relay holds its partitions this way: if the relay dies, its connection ends and
    Postgres releases the locks at once, so another relay can take the partitions over.
    """

    def __init__(self, conn: asyncpg.Connection) -> None:
        self._conn = conn

    @classmethod
    async def connect(cls, dsn: str, *, idle_timeout_ms: int | None = None) -> "LockSession":
        """A lock session; with `idle_timeout_ms`, Postgres ends it (freeing its locks)
        when its holder has sent nothing for that long: frozen, or cut off from Postgres
        by a network fault that TCP would take hours to notice."""
        try:
            session = cls(await asyncpg.connect(dsn))
        except (OSError, asyncpg.PostgresError) as exc:
            raise Unavailable(f"Postgres unreachable for locks: {exc}") from exc
        if idle_timeout_ms is not None:
            try:
                await session._conn.fetchval(
                    QUERIES["lock_idle_timeout"], str(idle_timeout_ms), timeout=LOCK_TIMEOUT_S
                )
            except asyncpg.UndefinedObjectError:
                # Postgres before 14: a stuck holder keeps its locks until TCP gives up.
                log.warning("Postgres has no idle_session_timeout; a stuck relay keeps its locks")
            except CONNECTION_ERRORS as exc:
                await session.close()
                raise Unavailable(f"lock connection failed during setup: {exc}") from exc
        return session

    async def _value(self, name: str, *args: Any) -> Any:
        try:
            return await self._conn.fetchval(QUERIES[name], *args, timeout=LOCK_TIMEOUT_S)
        except CONNECTION_ERRORS as exc:
            raise Unavailable(f"lock connection failed during {name}: {exc}") from exc

    async def try_lock(self, space: int, key: int) -> bool:
        return bool(await self._value("lock_try", space, key))

    @property
    def open(self) -> bool:
        """False as soon as the connection is known to be gone (its locks with it)."""
        return not self._conn.is_closed()

    async def ping(self) -> None:
        """Unavailable when the session (and so every lock it held) is gone."""
        await self._value("lock_ping")

    async def unlock(self, space: int, key: int) -> None:
        await self._value("lock_release", space, key)

    async def holders(self, space: int) -> int:
        """How many sessions hold some lock of `space` in this database."""
        return int(await self._value("lock_holders", space))

    async def close(self) -> None:
        if not self._conn.is_closed():
            try:
                await self._conn.close(timeout=LOCK_TIMEOUT_S)
            except CONNECTION_ERRORS:
                self._conn.terminate()


class KeptLockSession:
    """A lock session kept for as long as its holder lives: opened (then `on_open`, which
    takes the holder's locks) when there is none, pinged when there is one. An executor
    keeps its presence lock this way; recovery, to know how long its own has lived."""

    def __init__(
        self, dsn: str, on_open: Callable[[LockSession], Awaitable[None]] | None = None
    ) -> None:
        self._dsn = dsn
        self._on_open = on_open
        self.session: LockSession | None = None
        # Event-loop time at which the current session was opened.
        self.opened_at = 0.0
        # One check at a time: its connection takes one query at a time, and two checks
        # that found no session would each open one.
        self._checking = asyncio.Lock()

    async def check(self) -> RunwireError | None:
        """None when the session is there now; else why not (and it is closed). Callers
        that check at the same moment take turns."""
        async with self._checking:
            return await self._check()

    async def _check(self) -> RunwireError | None:
        try:
            if self.session is None:
                session = await LockSession.connect(self._dsn)
                try:
                    if self._on_open is not None:
                        await self._on_open(session)
                except BaseException:
                    await session.close()
                    raise
                self.session = session
                self.opened_at = asyncio.get_running_loop().time()
            else:
                await self.session.ping()
        except RunwireError as exc:
            await self.close()
            return exc
        return None

    async def close(self) -> None:
        session, self.session = self.session, None
        if session is not None:
            await session.close()
