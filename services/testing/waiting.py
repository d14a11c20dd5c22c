"""Helpers for tests that wait on something happening elsewhere (never on bare sleeps)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

T = TypeVar("T")


@overload
async def eventually(
    check: Callable[[], Awaitable[T]], timeout: float = 10, interval: float = 0.02
) -> T: ...


@overload
async def eventually(check: Callable[[], T], timeout: float = 10, interval: float = 0.02) -> T: ...


async def eventually(
    check: Callable[[], Awaitable[T] | T], timeout: float = 10, interval: float = 0.02
) -> T:
    """Call `check` (sync or async) until it returns a truthy value, and return that value.

    An AssertionError from `check` means "not yet", like a falsy result; any other
    exception fails at once. After `timeout` seconds the last AssertionError is re-raised,
    or, if the last call returned a falsy value, an AssertionError says which.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    attempts = 0
    while True:
        attempts += 1
        failure: AssertionError | None = None
        value: T | None = None
        try:
            outcome = check()
            if inspect.isawaitable(outcome):
                value = await outcome
            else:
                value = outcome
        except AssertionError as exc:
            failure = exc
        else:
            if value:
                return value
        if loop.time() >= deadline:
            if failure is not None:
                raise failure
            name = getattr(check, "__qualname__", repr(check))
            raise AssertionError(
                f"{name} still returned {value!r} after {timeout} s ({attempts} attempts)"
            )
        await asyncio.sleep(interval)


async def fault_window(seconds: float, what: str) -> None:
    """Let a fault the test made last `seconds` (`what` says which: an outage, a frozen
    process, a lease left to expire). Not a wait for something to happen: use
    `eventually` for that."""
    del what  # read by whoever reads the test
    await asyncio.sleep(seconds)


async def pace(seconds: float, what: str) -> None:
    """Hold a test's own loop for `seconds` (`what` says why: a slow reader, the pause
    between two tries of a command the test retries, a soak's rhythm)."""
    del what
    await asyncio.sleep(seconds)
