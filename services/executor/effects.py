"""One attempt's side effects, through the fence (see `runwire.runners.effects`).

Every move of an effect is a guarded write expecting the row's version; a move that
finds the row moved on reads it again and decides from there. Fault points mark each
boundary a crash must survive: after prepare, after claim, after dispatch, after commit.
"""

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from runwire.contracts.errors import ErrorCode
from runwire.contracts.frames import EffectState, FrameType, WaitKind
from runwire.runners.base import RunnerError
from runwire.runners.effects import (
    EffectAdapter,
    EffectOutcomeUnknown,
    EffectRejected,
    Reconciled,
    digest,
    idempotency_key,
    policy_refusal,
)
from runwire.runtime import faults
from runwire.runtime.errors import LostRace
from runwire.runtime.store import BudgetGrant, Effect, Store

log = logging.getLogger(__name__)

Emit = Callable[[FrameType, dict[str, Any]], Awaitable[None]]
# How many times a move that lost a race reads the row again before giving up.
MOVES = 8
# How long a run waits before it asks again whether a pending effect happened.
DEFAULT_PENDING_WAIT_S = 30.0
# A durable wait of the attempt: (kind, name, payload, timeout_s, key) -> its answer.
Wait = Callable[[WaitKind, str | None, Any, float | None, str | None], Awaitable[Any]]


async def reconcile(adapter: EffectAdapter, effect: Effect, request: dict[str, Any]) -> Reconciled:
    """What the adapter knows of `effect`; `unknown` when the reconcile itself fails (a
    connection error, an adapter's bug): the effect is reconciled again later, never
    taken for one that did not happen."""
    try:
        return await adapter.reconcile(request, idempotency_key=effect.idempotency_key)
    except Exception as exc:
        log.warning(
            "effect %s of run %s: reconcile failed; tried again later",
            effect.key,
            effect.run_id,
            exc_info=exc,
        )
        return Reconciled("unknown")


class EffectFence:
    """Carries out the effects of one attempt of a run."""

    def __init__(
        self,
        store: Store,
        adapters: Mapping[str, EffectAdapter],
        *,
        run_id: str,
        tenant: str,
        generation: int,
        emit: Emit,
        claim_ms: int,
        wait: Wait | None = None,
        pending_wait_s: float = DEFAULT_PENDING_WAIT_S,
    ) -> None:
        self.store = store
        self.adapters = adapters
        self.run_id = run_id
        self.tenant = tenant
        self.generation = generation
        self.emit = emit
        self.claim_ms = claim_ms
        # A durable timer (the attempt's waits): an effect whose outcome is pending makes
        # the run wait, holding no worker, and look again when it rings.
        self.wait = wait
        self.pending_wait_s = pending_wait_s

    async def _frame(self, effect: Effect) -> None:
        receipt = effect.receipt or {}
        await self.emit(
            FrameType.EFFECT,
            {
                "key": effect.key,
                "kind": effect.kind,
                "state": effect.state,
                "receipt_id": str(receipt["id"]) if "id" in receipt else None,
                "error": effect.error,
            },
        )

    async def _settle(
        self,
        effect: Effect,
        state: EffectState,
        receipt: Any = None,
        error: str | None = None,
        code: ErrorCode | None = None,
    ) -> Effect | None:
        settled = await self.store.effect_settle(
            self.run_id,
            effect.key,
            effect.version,
            state.value,
            receipt,
            error,
            code.value if code is not None else None,
        )
        if settled is not None:
            await self._frame(settled)
        return settled

    async def run(
        self, kind: str, key: str, request: dict[str, Any], *, tokens: int = 0, cost: int = 0
    ) -> dict[str, Any]:
        """The receipt of effect `key`: dispatched at most once over every attempt. With
        `tokens` or `cost`, the effect reserves that much budget when it is prepared."""
        adapter = self.adapters.get(kind)
        if adapter is None:
            raise RunnerError(
                f"no effect adapter named {kind!r} is registered (known: "
                f"{', '.join(sorted(self.adapters)) or 'none'})",
                retryable=False,
            )
        wanted = digest(request)
        try:
            effect = await self.store.effect_prepare(
                self.run_id,
                self.generation,
                key=key,
                kind=kind,
                idempotency_key=idempotency_key(self.run_id, key),
                request=request,
                digest=wanted,
                tokens=max(0, tokens),
                cost=max(0, cost),
            )
        except LostRace as exc:
            raise RunnerError("the attempt no longer holds the run", retryable=True) from exc
        if isinstance(effect, BudgetGrant):
            raise RunnerError(
                f"effect {key!r} needs {tokens} tokens and {cost} cost units of budget; "
                f"{effect.shortfall()}",
                retryable=False,
                code=ErrorCode.BUDGET_EXCEEDED,
            )
        if effect.request_digest != wanted or effect.kind != kind:
            raise RunnerError(
                f"effect {key!r} was prepared with another request; an effect's key must name "
                "one action",
                retryable=False,
            )
        if effect.version == 1 and effect.state == EffectState.PREPARED:
            await self._frame(effect)
        await faults.point(faults.EFFECT_PREPARED)
        for _ in range(MOVES):
            outcome = await self._move(adapter, effect, request)
            if isinstance(outcome, dict):
                return outcome
            effect = outcome
        raise RunnerError(f"effect {key!r} kept changing under this attempt", retryable=True)

    async def _reread(self, effect: Effect) -> Effect:
        found = await self.store.effect_prepare(
            self.run_id,
            self.generation,
            key=effect.key,
            kind=effect.kind,
            idempotency_key=effect.idempotency_key,
            request=effect.request,
            digest=effect.request_digest,
        )
        assert isinstance(found, Effect)  # reserves nothing, so never refused
        return found

    async def _deadline(self, effect: Effect) -> Effect:
        """Fail an effect whose dispatch ran past its claim's deadline (once: the write
        is guarded, so a second attempt or replica that sees it reads the failure)."""
        message = f"the dispatch of effect {effect.key!r} ran past its deadline"
        settled = await self._settle(
            effect, EffectState.FAILED, error=message, code=ErrorCode.EFFECT_DEADLINE_EXCEEDED
        )
        return settled if settled is not None else await self._reread(effect)

    async def _while_pending(
        self, adapter: EffectAdapter, effect: Effect, request: dict[str, Any]
    ) -> tuple[Reconciled, Effect]:
        """Wait on a durable timer (the run holds no worker) and reconcile again, while the
        adapter says the outcome is pending and the effect's deadline has not passed; the
        timers of earlier attempts have rung: they return at once."""
        assert self.wait is not None
        payload = {"effect": effect.key, "status": "pending"}
        checks = itertools.count(1)
        while True:
            key = f"effect-{effect.key}-{next(checks)}"
            await self.wait(WaitKind.SLEEP, None, payload, self.pending_wait_s, key)
            effect = await self._reread(effect)
            found = await reconcile(adapter, effect, request)
            if found.status != "pending" or effect.past_deadline:
                return found, effect

    async def _move(
        self, adapter: EffectAdapter, effect: Effect, request: dict[str, Any]
    ) -> dict[str, Any] | Effect:
        """One step: the receipt when done, else the effect as it stands now."""
        state = EffectState(effect.state)
        if state in (EffectState.COMMITTED, EffectState.RECONCILED):
            return dict(effect.receipt or {})
        if state == EffectState.FAILED:
            raise RunnerError(
                f"effect {effect.key!r} failed: {effect.error}",
                retryable=False,
                code=ErrorCode(effect.error_code or ErrorCode.EFFECT_FAILED),
            )
        if state in (EffectState.CLAIMED, EffectState.UNKNOWN):
            # Claimed by an attempt that did not finish it: never dispatched blindly.
            found = await reconcile(adapter, effect, request)
            if found.status == "pending" and self.wait is not None:
                found, effect = await self._while_pending(adapter, effect, request)
            if found.status == "committed":
                target = (
                    EffectState.COMMITTED
                    if state == EffectState.CLAIMED
                    else EffectState.RECONCILED
                )
                settled = await self._settle(effect, target, found.receipt or {})
                return (
                    dict(found.receipt or {}) if settled is not None else await self._reread(effect)
                )
            if found.status != "not_found" and effect.past_deadline:
                return await self._deadline(effect)
            if found.status != "not_found":
                if state != EffectState.UNKNOWN:
                    await self._settle(
                        effect, EffectState.UNKNOWN, error=f"reconcile: {found.status}"
                    )
                raise RunnerError(
                    f"effect {effect.key!r}: whether it happened is not known yet "
                    f"({found.status}); a later attempt reconciles it again",
                    retryable=True,
                )
        claim = await self.store.effect_claim(
            self.run_id, effect.key, effect.version, self.generation, self.claim_ms, effect.kind
        )
        if claim.effect is None:
            return await self._reread(effect)
        if not claim.claimed:
            if not claim.fresh:
                message = (
                    f"effect {effect.key!r}: the run's authorization is stale (its tenant's "
                    "policy changed after it was submitted)"
                )
                code = ErrorCode.AUTHORIZATION_STALE
            elif not claim.tenant_permits:
                message = f"effect {effect.key!r}: {policy_refusal(effect.kind, self.tenant)}"
                code = ErrorCode.EFFECT_FAILED
            else:
                message = (
                    f"effect {effect.key!r}: the run may not perform effects of kind "
                    f"{effect.kind!r} (the effects it was submitted with exclude it)"
                )
                code = ErrorCode.EFFECT_FAILED
            settled = await self._settle(claim.effect, EffectState.FAILED, error=message, code=code)
            return settled if settled is not None else await self._reread(effect)
        claimed = claim.effect
        await self._frame(claimed)
        await faults.point(faults.EFFECT_CLAIMED)
        try:
            receipt = await asyncio.wait_for(
                adapter.dispatch(
                    request, idempotency_key=claimed.idempotency_key, fence=claimed.fence
                ),
                self.claim_ms / 1000,
            )
        except TimeoutError:
            return await self._deadline(claimed)
        except EffectRejected as exc:
            await self._settle(claimed, EffectState.FAILED, error=str(exc))
            raise RunnerError(
                f"effect {effect.key!r} was refused: {exc}",
                retryable=False,
                code=ErrorCode.EFFECT_FAILED,
            ) from exc
        except Exception as exc:
            # Its text (a URL with its key, a provider's answer) stays in the log: the
            # effect frame and the run's error name its class only, unless the adapter
            # wrote the message for the run (EffectOutcomeUnknown).
            log.warning("effect %s: dispatch outcome unknown", effect.key, exc_info=exc)
            failure = str(exc) if isinstance(exc, EffectOutcomeUnknown) else type(exc).__name__
            await self._settle(claimed, EffectState.UNKNOWN, error=f"dispatch: {failure}")
            raise RunnerError(
                f"effect {effect.key!r}: the dispatch's outcome is unknown ({failure}; the "
                "executor logged the details with the run_id); a later attempt reconciles it",
                retryable=True,
            ) from exc
        await faults.point(faults.EFFECT_DISPATCHED)
        committed = await self._settle(claimed, EffectState.COMMITTED, receipt)
        if committed is None:
            return await self._reread(claimed)
        await faults.point(faults.EFFECT_COMMITTED)
        return dict(receipt)
