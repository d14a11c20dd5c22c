"""Which relay consumes which partition of a stream (the archiver has one: the whole
frames stream).

Each partition is consumed by exactly one relay at a time, which keeps a run's segments
in order: ownership is a Postgres advisory lock held on a dedicated connection, so a
relay that dies loses its partitions the moment its connection ends. Every relay also
holds a presence lock; with N relays alive each aims to own ceil(P / N) partitions,
releasing extras (after flushing) and taking free ones on every rebalance.
"""

import asyncio
import contextlib
import logging
import math
import random
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from runwire.runtime.errors import RunwireError
from runwire.runtime.settings import DEFAULT_PARTITION_TIMEOUT_MS
from runwire.runtime.store import LockSession

log = logging.getLogger(__name__)

PARTITION_LOCKS = 72_401_131
PRESENCE_LOCKS = 72_401_132
# The archive's lock (its one partition): a class of its own, so that a relay of an
# earlier version, still draining the raw-frames partitions, holds none of it.
ARCHIVE_LOCKS = 72_401_134
REBALANCE_S = 1.0

Consume = Callable[[int, asyncio.Event], Coroutine[Any, Any, None]]
Release = Callable[[int], Awaitable[None]]


class PartitionOwner:
    """Holds partitions for this relay and runs one consumer task per partition."""

    def __init__(
        self,
        dsn: str,
        partitions: int,
        consume: Consume,
        released: Release,
        *,
        timeout_ms: int = DEFAULT_PARTITION_TIMEOUT_MS,
        lock_class: int = PARTITION_LOCKS,
    ) -> None:
        self._dsn = dsn
        self._lock_class = lock_class
        self._partitions = partitions
        self._consume = consume
        self._released = released
        self._timeout_ms = timeout_ms
        # Rebalancing also shows Postgres that this relay is alive: well inside the timeout.
        self._every_s = min(REBALANCE_S, timeout_ms / 4000)
        self._locks: LockSession | None = None
        self._owned: dict[int, tuple[asyncio.Task[None], asyncio.Event]] = {}
        self._member = random.randrange(1, 2**31 - 1)
        self._confirmed_at = float("-inf")

    def current(self) -> bool:
        """Whether this relay's locks were confirmed recently enough to act on them.

        After a pause (a freeze, a stalled loop) past half the timeout, Postgres may have
        ended the lock session and another relay may own the partitions: consumers wait
        for the next confirmation before publishing anything more."""
        age = asyncio.get_running_loop().time() - self._confirmed_at
        return age < self._timeout_ms / 2000

    @property
    def owned(self) -> list[int]:
        return sorted(self._owned)

    async def run(self, stop: asyncio.Event) -> None:
        """Rebalance every second until `stop`; then stop every partition."""
        try:
            while not stop.is_set():
                try:
                    await self._rebalance()
                except RunwireError as exc:
                    log.warning("partition locks lost (%s); stopping every partition", exc.message)
                    await self._drop_all()
                for task, _ in list(self._owned.values()):
                    if task.done() and not task.cancelled() and task.exception() is not None:
                        log.error("partition consumer failed", exc_info=task.exception())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self._every_s)
        finally:
            await self._drop_all()

    async def _rebalance(self) -> None:
        if self._locks is None:
            self._locks = await LockSession.connect(self._dsn, idle_timeout_ms=self._timeout_ms)
            if not await self._locks.try_lock(PRESENCE_LOCKS, self._member):
                raise RunwireError("presence lock taken")
        for partition, (task, _) in list(self._owned.items()):
            if task.done():  # a consumer that died gives its partition back
                await self._release(partition)
        relays = max(1, await self._locks.holders(PRESENCE_LOCKS))
        self._confirmed_at = asyncio.get_running_loop().time()
        target = math.ceil(self._partitions / relays)
        while len(self._owned) > target:
            await self._release(max(self._owned))
        if len(self._owned) < target:
            # Start at a different partition in each relay, so that they rarely collide.
            start = self._member % self._partitions
            for i in range(self._partitions):
                partition = (start + i) % self._partitions
                if len(self._owned) >= target:
                    break
                if partition not in self._owned and await self._locks.try_lock(
                    self._lock_class, partition
                ):
                    stop = asyncio.Event()
                    task = asyncio.create_task(self._consume(partition, stop))
                    self._owned[partition] = (task, stop)
                    log.info("took partition %d", partition)

    async def _release(self, partition: int) -> None:
        task, stop = self._owned.pop(partition)
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 30)
        await self._released(partition)
        if self._locks is not None:
            await self._locks.unlock(self._lock_class, partition)
        log.info("released partition %d", partition)

    async def _drop_all(self) -> None:
        self._confirmed_at = float("-inf")
        for partition in list(self._owned):
            task, stop = self._owned.pop(partition)
            stop.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 30)
            with contextlib.suppress(Exception):
                await self._released(partition)
        if self._locks is not None:
            await self._locks.close()
            self._locks = None
