"""Side effects that happen once: adapters, and the fence a runner's effect goes through.

A runner (or a tool) performs an external action with `await ctx.effect(kind, key,
request)`. `kind` names an adapter (entry-point group `runwire.effects`; `http` and
`noop` ship), `key` is the runner's stable name for the action within the run, so that a
retried or resumed attempt asking for the same effect gets the same one. The effect is a
row in Postgres that moves `prepared` → `claimed` → `committed` (or `failed`, or
`unknown`, later `reconciled`), each move a guarded write:

- prepare persists the command before anything leaves the process;
- claim takes a fence token (a claim raises it), fenced by the run's generation;
- dispatch calls the adapter with the idempotency key and the fence token;
- commit stores the adapter's receipt. A committed effect is never dispatched again:
  a later attempt gets the stored receipt.

An effect found claimed (its attempt crashed or froze) is never dispatched blindly: the
adapter reconciles it by idempotency key. Committed: its receipt is stored. Not found:
it is claimed again (a higher fence) and dispatched. Pending or unknowable: the effect
is `unknown` and the attempt fails retryably; the next one reconciles again.
"""

import hashlib
import inspect
import json
import logging
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import httpx

from runwire.runners.registry import RunnerConfigError, load_named

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "runwire.effects"
IDEMPOTENCY_HEADER = "Idempotency-Key"
FENCE_HEADER = "Runwire-Fence-Token"
HTTP_TIMEOUT_S = 30.0


class EffectRejected(Exception):
    """The adapter says the action was refused and did not happen: the effect fails."""


@dataclass(frozen=True)
class Reconciled:
    """What an adapter knows of an effect by its idempotency key."""

    status: Literal["committed", "pending", "not_found", "unknown"]
    receipt: dict[str, Any] | None = None


class EffectAdapter(Protocol):
    """Carries out one kind of external action."""

    async def dispatch(
        self, request: dict[str, Any], *, idempotency_key: str, fence: int
    ) -> dict[str, Any]:
        """Perform the action; return its receipt (with an `id` if the other side has
        one). Raise EffectRejected for a definite refusal; any other exception leaves
        the outcome unknown."""
        ...

    async def reconcile(self, request: dict[str, Any], *, idempotency_key: str) -> Reconciled:
        """Whether the action with this idempotency key happened."""
        ...


def policy_refusal(kind: str, tenant: str) -> str:
    """Why a tenant's run may not perform an effect of `kind`, and the operator's command
    that allows it (a tenant may perform no effect kind until an operator allows it)."""
    return (
        f"tenant {tenant!r} may not perform effects of kind {kind!r}; an operator must "
        f"allow it first: runwire --env .runwire/operator.env --tenant {tenant} policy "
        f"--effects {kind} (the list replaces the tenant's policy: name every kind it may "
        "perform, comma-separated, or 'any')"
    )


def idempotency_key(run_id: str, key: str) -> str:
    """The key the other side deduplicates on: stable for the run's effect `key`."""
    return "rw-" + hashlib.sha256(f"{run_id}\0{key}".encode()).hexdigest()[:40]


def digest(request: dict[str, Any]) -> str:
    """A digest of the request, to refuse a key reused for another request."""
    canonical = json.dumps(request, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


class NoopAdapter:
    """Does nothing and says so (for tests and dry runs); it remembers nothing, so a
    reconcile never finds an effect and a claimed one is dispatched again."""

    async def dispatch(
        self, request: dict[str, Any], *, idempotency_key: str, fence: int
    ) -> dict[str, Any]:
        return {"id": f"noop-{idempotency_key}", "fence": fence}

    async def reconcile(self, request: dict[str, Any], *, idempotency_key: str) -> Reconciled:
        return Reconciled("not_found")


class HttpAdapter:
    """POST `request["url"]` with `request["body"]` (JSON), the `Idempotency-Key` and
    `Runwire-Fence-Token` headers and `request["headers"]`. 2xx: done, its JSON body is
    the receipt; another 4xx: refused; anything else: unknown. Reconcile: GET
    `request["status_url"]` (`{idempotency_key}` in it is filled in): 200 done (its
    JSON body the receipt), 202 pending, 404 never seen."""

    def __init__(self, timeout_s: float = HTTP_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s

    @staticmethod
    def _receipt(response: httpx.Response) -> dict[str, Any]:
        try:
            body = response.json()
        except ValueError:
            body = {"body": response.text[:2000]}
        return body if isinstance(body, dict) else {"body": body}

    async def dispatch(
        self, request: dict[str, Any], *, idempotency_key: str, fence: int
    ) -> dict[str, Any]:
        headers = {
            **{str(k): str(v) for k, v in (request.get("headers") or {}).items()},
            IDEMPOTENCY_HEADER: idempotency_key,
            FENCE_HEADER: str(fence),
        }
        async with httpx.AsyncClient(timeout=self.timeout_s) as client:
            response = await client.post(
                str(request["url"]), json=request.get("body"), headers=headers
            )
        if response.is_success:
            return self._receipt(response)
        if 400 <= response.status_code < 500 and response.status_code not in (408, 429):
            raise EffectRejected(f"{response.status_code}: {response.text[:500]}")
        raise RuntimeError(f"the effect's endpoint answered {response.status_code}")

    async def reconcile(self, request: dict[str, Any], *, idempotency_key: str) -> Reconciled:
        status_url = request.get("status_url")
        if not status_url:
            return Reconciled("unknown")
        url = str(status_url).replace("{idempotency_key}", idempotency_key)
        async with httpx.AsyncClient(timeout=self.timeout_s) as client:
            response = await client.get(url)
        if response.status_code == 200:
            return Reconciled("committed", self._receipt(response))
        if response.status_code == 404:
            return Reconciled("not_found")
        if response.status_code == 202:
            return Reconciled("pending")
        return Reconciled("unknown")


def _adapter(obj: object, where: str) -> EffectAdapter:
    if inspect.isclass(obj):
        obj = obj()
    if not all(
        inspect.iscoroutinefunction(getattr(obj, name, None)) for name in ("dispatch", "reconcile")
    ):
        raise RunnerConfigError(f"{where} is not an effect adapter (async dispatch and reconcile)")
    return obj  # type: ignore[return-value]


def load_effects(extra: dict[str, object] | None = None) -> dict[str, EffectAdapter]:
    """Every effect adapter this process has: entry points, then `extra`."""
    return load_named(ENTRY_POINT_GROUP, _adapter, what="effect adapter", extra=extra)
