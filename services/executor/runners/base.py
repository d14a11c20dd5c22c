"""The runner interface: what one attempt of a run receives and may do.

A runner is an async callable taking an `AttemptContext` and returning an optional
result dict. It fails by raising `RunnerError(retryable=...)`; it should stop soon
after `ctx.abort` is set (cancel, deadline, shutdown), or it is abandoned.
"""

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from runwire.contracts.frames import FrameType


class RunnerError(Exception):
    """A runner's failure; `retryable` decides between a retry and failing the run."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable


class AttemptClosed(Exception):
    """Raised by `emit` once the attempt has been closed: nothing it does counts now."""


@dataclass
class AttemptContext:
    """Everything an attempt may know and do."""

    run_id: str
    tenant: str
    input: dict[str, Any]
    attempt: int
    resumed: bool
    continuation: str
    checkpoint_state: Any
    abort: asyncio.Event
    _emit: Callable[[FrameType, dict[str, Any]], Awaitable[None]]
    _checkpoint: Callable[[Any], Awaitable[None]]

    async def emit(self, type: FrameType, data: dict[str, Any]) -> None:
        """Publish a frame of this attempt."""
        await self._emit(type, data)

    async def message(self, text: str) -> None:
        """Publish a text delta."""
        await self._emit(FrameType.MESSAGE, {"text": text})

    async def checkpoint(self, state: Any) -> None:
        """Save progress that a resumed attempt receives as `checkpoint_state`."""
        await self._checkpoint(state)

    async def sleep(self, seconds: float) -> None:
        """Sleep, waking early if the attempt is aborted."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.abort.wait(), timeout=seconds)


Runner = Callable[[AttemptContext], Coroutine[Any, Any, dict[str, Any] | None]]
