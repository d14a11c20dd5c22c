"""Many callers' rows in one statement: what the attempts of an executor ask Postgres
at the same moment (their claims, lease renewals, cancel polls, finishes) goes as one
query.

A call waits for the batch it joined. Calls made in one turn of the event loop make one
batch; while PARALLEL batches are under way, later calls wait for the next one. So a
lone call costs one query, as before, a thousand attempts that renew their leases
together cost one, and under load Postgres still works on several batches at once (one
batch at a time would be one connection's worth of Postgres).
"""

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

# The most rows of one statement.
MAX_BATCH = 1000
# The most statements of one batcher under way at once.
PARALLEL = 4


class Batcher(Generic[T, R]):
    """Runs `run` on the items of the calls gathered (it returns one result per item,
    in order); each call gets its item's result, or the statement's error."""

    def __init__(self, run: Callable[[list[T]], Awaitable[list[R]]]) -> None:
        self._run = run
        self._waiting: list[tuple[T, asyncio.Future[R]]] = []
        self._running: set[asyncio.Task[None]] = set()

    async def __call__(self, item: T) -> R:
        done: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, done))
        if len(self._running) < PARALLEL:
            task = asyncio.create_task(self._drain())
            self._running.add(task)
            task.add_done_callback(self._running.discard)
        return await done

    async def _drain(self) -> None:
        await asyncio.sleep(0)  # the calls of this turn of the loop join the batch
        while self._waiting:
            batch, self._waiting = self._waiting[:MAX_BATCH], self._waiting[MAX_BATCH:]
            try:
                results = await self._run([item for item, _ in batch])
            except Exception as exc:  # noqa: BLE001 - each caller gets it, as from its own query
                for _, done in batch:
                    if not done.done():
                        done.set_exception(exc)
                continue
            for (_, done), result in zip(batch, results, strict=True):
                if not done.done():  # a caller that gave up (canceled) is skipped
                    done.set_result(result)
