"""An attempt's waits (`ctx.interrupt`, `ctx.wait_for_signal`): each begun in Postgres
(or found there, decided, when a later attempt asks again), and one not answered yet
ends the attempt so that the run waits holding no worker (see sql/functions/waits.sql)."""

from collections.abc import Awaitable, Callable
from typing import Any

from runwire.contracts.commands import MAX_ID_LENGTH
from runwire.contracts.frames import FrameType, WaitKind
from runwire.runners.base import AttemptClosed, RunnerError, Waiting, WaitTimeout
from runwire.runtime.metrics import WAIT_DURATION
from runwire.runtime.store import Store
from runwire.runtime.store.waits import WaitState


class AttemptWaits:
    """The waits of one attempt of a run."""

    def __init__(
        self,
        store: Store,
        run_id: str,
        generation: int,
        emit: Callable[[FrameType, dict[str, Any]], Awaitable[None]],
        storable: Callable[[str, Any], Any],
    ) -> None:
        self._store = store
        self._run_id = run_id
        self._generation = generation
        self._emit = emit
        self._storable = storable
        self._begun = 0
        # The wait this attempt ends for, once one had no answer yet.
        self.waiting_on: str | None = None

    async def begin(
        self,
        kind: WaitKind,
        name: str | None,
        payload: Any,
        timeout_s: float | None,
        key: str | None,
    ) -> Any:
        """The wait's answer; Waiting when the attempt must end to wait for it,
        WaitTimeout when it timed out."""
        if self.waiting_on is not None:
            raise Waiting(f"the attempt already ends to wait for {self.waiting_on}")
        self._begun += 1
        wait_id = key or f"{kind}-{self._begun}"
        if not 0 < len(wait_id) <= MAX_ID_LENGTH:
            raise RunnerError(
                f"a wait's key is 1 to {MAX_ID_LENGTH} characters long", retryable=False
            )
        if timeout_s is not None and timeout_s < 0:
            raise RunnerError("a wait's timeout is not negative", retryable=False)
        payload = self._storable("wait payload", payload)
        begun = await self._store.wait_begin(
            self._run_id,
            self._generation,
            wait_id,
            kind=kind,
            name=name,
            payload=payload,
            timeout_ms=None if timeout_s is None else round(timeout_s * 1000),
        )
        if begun.waited_s is not None:
            WAIT_DURATION.labels(kind.value, begun.state.value).observe(begun.waited_s)
        if begun.state == WaitState.ANSWERED:
            return begun.value
        if begun.state == WaitState.TIMED_OUT:
            raise WaitTimeout(f"wait {wait_id} had no answer in time", wait_id=wait_id)
        if begun.state == WaitState.LOST:
            raise AttemptClosed(f"attempt {self._generation} of run {self._run_id} is closed")
        data: dict[str, Any] = {"wait_id": wait_id, "kind": kind, "payload": payload}
        if name is not None:
            data["name"] = name
        if begun.timeout_at is not None:
            data["timeout_at"] = begun.timeout_at.isoformat()
        await self._emit(FrameType.WAIT, data)
        self.waiting_on = wait_id
        raise Waiting(f"the run waits for {wait_id}")
