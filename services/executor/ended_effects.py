"""The effects that runs which ended left open, settled by the executors that have their
adapters.

An effect found `claimed` or `unknown` is reconciled by the run's next attempt; a run
that ended (failed, canceled) has none. Every `effect_reconcile_ms` an executor takes
such effects of the kinds it has and asks their adapter, by idempotency key, whether the
action happened. Done: `committed` (or `reconciled`), its reservation charged. Never
seen: `failed`, its reservation released (nothing dispatches for a run that ended).
Still not known once the claim's deadline has passed: `failed` with
EFFECT_DEADLINE_EXCEEDED, charged (it may have happened), for an operator to correct with
`resolve_effect`. Each move is a run event (`effect_resolved`).
"""

import asyncio
import contextlib
import logging
from collections.abc import Mapping

from runwire.contracts.errors import ErrorCode
from runwire.contracts.frames import EffectState
from runwire.executor.effects import reconcile
from runwire.runners.effects import EffectAdapter
from runwire.runtime.errors import RunwireError
from runwire.runtime.logs import bind, fields
from runwire.runtime.store import Effect, Store

log = logging.getLogger(__name__)

# Effects looked at per sweep.
BATCH = 50


class EndedEffects:
    """Reconciles the open effects of ended runs, of the kinds this executor has."""

    def __init__(
        self, store: Store, adapters: Mapping[str, EffectAdapter], *, every_ms: int, actor: str
    ) -> None:
        self.store = store
        self.adapters = adapters
        self.every_ms = every_ms
        self.actor = actor

    async def watch(self, stop: asyncio.Event) -> None:
        """Sweep every `every_ms` until `stop`."""
        while not stop.is_set():
            try:
                await self.sweep()
            except RunwireError as exc:
                log.warning("effects of ended runs not reconciled: %s", exc.message)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.every_ms / 1000)

    async def sweep(self) -> int:
        """One look; how many effects it settled."""
        if not self.adapters:
            return 0
        found = await self.store.ended_effects(sorted(self.adapters), BATCH, self.every_ms)
        settled = 0
        for effect in found:
            with bind(run_id=effect.run_id):
                settled += await self._settle(effect)
        return settled

    async def _settle(self, effect: Effect) -> bool:
        found = await reconcile(self.adapters[effect.kind], effect, effect.request)
        if found.status == "committed":
            claimed = effect.state == EffectState.CLAIMED
            state = EffectState.COMMITTED if claimed else EffectState.RECONCILED
            moved = await self.store.settle_ended_effect(
                effect, state.value, receipt=dict(found.receipt or {}), actor=self.actor
            )
        elif found.status == "not_found":
            moved = await self.store.settle_ended_effect(
                effect,
                EffectState.FAILED.value,
                error="never performed: its run ended before it was dispatched",
                error_code=ErrorCode.EFFECT_FAILED.value,
                actor=self.actor,
            )
        elif effect.past_deadline:
            moved = await self.store.settle_ended_effect(
                effect,
                EffectState.FAILED.value,
                error=(
                    f"its run ended and whether it happened is not known ({found.status}); "
                    "it may have happened: an operator settles it with resolve_effect"
                ),
                error_code=ErrorCode.EFFECT_DEADLINE_EXCEEDED.value,
                actor=self.actor,
            )
        else:
            return False  # asked again after its claim's deadline
        if moved:
            log.info(
                "effect of an ended run settled",
                extra=fields(key=effect.key, reconciled=found.status),
            )
        return moved
