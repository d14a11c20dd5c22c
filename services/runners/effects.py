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

import functools
import hashlib
import inspect
import json
import logging
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import httpx

from runwire.runners.outbound import GuardedTransport, OutboundGuard, OutboundRefused
from runwire.runners.registry import RunnerConfigError, load_named

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "runwire.effects"
IDEMPOTENCY_HEADER = "Idempotency-Key"
FENCE_HEADER = "Runwire-Fence-Token"
HTTP_TIMEOUT_S = 30.0
# Redirects an http effect follows, each hop checked by the outbound guard.
MAX_REDIRECTS = 3
# The text of a body that is not JSON, kept when the request asks for the response.
KEPT_TEXT_CHARS = 2000


class EffectRejected(Exception):
    """The adapter says the action was refused and did not happen: the effect fails."""


class EffectOutcomeUnknown(Exception):
    """The adapter cannot tell whether the action happened (the effect is `unknown`, and
    reconciled later). Its message is written for the run to read: no secret, none of
    the other side's text; any other exception is shown by its class alone."""


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
    `Runwire-Fence-Token` headers and `request["headers"]`. 2xx: done; another 4xx:
    refused; anything else: unknown. Reconcile: GET `request["status_url"]`
    (`{idempotency_key}` in it is filled in): 200 done, 202 pending, 404 never seen.

    The receipt is `{"status": <code>, "id": <the JSON body's "id">}` (`id` when it is a
    string or a number), and `"response": <the body>` too only when the request says
    `"keep_response": true`: what an endpoint answers is not copied into a run's result
    unless the runner asked for it, and an error names the status code only.

    Every request, and each redirect hop (up to `MAX_REDIRECTS`), goes through the
    executor's `OutboundGuard` (see `runwire.runners.outbound`): a target it refuses
    before anything was sent is a definite refusal (EffectRejected); a redirect it
    refuses leaves the outcome unknown (the request before it was sent)."""

    def __init__(
        self, guard: OutboundGuard | None = None, timeout_s: float = HTTP_TIMEOUT_S
    ) -> None:
        self.guard = guard if guard is not None else OutboundGuard()
        self.timeout_s = timeout_s

    def _client(self) -> httpx.AsyncClient:
        # No proxy from the environment: the guard must see the request's own target.
        return httpx.AsyncClient(
            transport=GuardedTransport(self.guard),
            timeout=self.timeout_s,
            follow_redirects=True,
            max_redirects=MAX_REDIRECTS,
            trust_env=False,
        )

    @staticmethod
    def _receipt(response: httpx.Response, keep: bool) -> dict[str, Any]:
        try:
            body: Any = response.json()
        except ValueError:
            body = response.text[:KEPT_TEXT_CHARS]
        receipt: dict[str, Any] = {"status": response.status_code}
        found = body.get("id") if isinstance(body, dict) else None
        if isinstance(found, str | int | float) and not isinstance(found, bool):
            receipt["id"] = found
        if keep:
            receipt["response"] = body
        return receipt

    async def dispatch(
        self, request: dict[str, Any], *, idempotency_key: str, fence: int
    ) -> dict[str, Any]:
        headers = {
            **{str(k): str(v) for k, v in (request.get("headers") or {}).items()},
            IDEMPOTENCY_HEADER: idempotency_key,
            FENCE_HEADER: str(fence),
        }
        url = request.get("url")
        if not isinstance(url, str) or not url:
            raise EffectRejected("an http effect's request needs a `url` (a string)")
        status_url = request.get("status_url")
        try:
            if status_url:
                # One that could never be asked is refused before anything is sent.
                await self.guard.pin(httpx.URL(_status_url(status_url, idempotency_key)))
            async with self._client() as client:
                response = await client.post(url, json=request.get("body"), headers=headers)
        except OutboundRefused as exc:
            if exc.hop == 0:
                raise EffectRejected(str(exc)) from exc
            raise EffectOutcomeUnknown(
                f"a redirect of the effect's request was refused ({exc}); the request "
                "before it was sent"
            ) from exc
        except httpx.InvalidURL as exc:
            raise EffectRejected(f"the effect's URL is invalid: {exc}") from exc
        except httpx.HTTPError as exc:
            raise _failed(exc) from exc
        if response.is_success:
            return self._receipt(response, bool(request.get("keep_response")))
        if 400 <= response.status_code < 500 and response.status_code not in (408, 429):
            raise EffectRejected(f"the effect's endpoint refused it: HTTP {response.status_code}")
        raise EffectOutcomeUnknown(f"the effect's endpoint answered HTTP {response.status_code}")

    async def reconcile(self, request: dict[str, Any], *, idempotency_key: str) -> Reconciled:
        status_url = request.get("status_url")
        if not status_url:
            return Reconciled("unknown")
        try:
            async with self._client() as client:
                response = await client.get(_status_url(status_url, idempotency_key))
        except (OutboundRefused, httpx.InvalidURL) as exc:
            log.warning("effect %s: its status URL cannot be asked: %s", idempotency_key, exc)
            return Reconciled("unknown")
        except httpx.HTTPError as exc:
            raise _failed(exc) from exc
        if response.status_code == 200:
            return Reconciled(
                "committed", self._receipt(response, bool(request.get("keep_response")))
            )
        if response.status_code == 404:
            return Reconciled("not_found")
        if response.status_code == 202:
            return Reconciled("pending")
        return Reconciled("unknown")


def _failed(exc: httpx.HTTPError) -> EffectOutcomeUnknown:
    """What a run is told of a request that failed: a connection's error says what went
    wrong, but a protocol error quotes the bytes the other side sent (a banner, a status
    line), which are not the run's to read."""
    if isinstance(exc, httpx.ConnectError | httpx.TimeoutException):
        return EffectOutcomeUnknown(f"the effect's request failed: {type(exc).__name__}: {exc}")
    log.warning("effect request failed: %r", exc)
    return EffectOutcomeUnknown(f"the effect's request failed: {type(exc).__name__}")


def _status_url(template: object, idempotency_key: str) -> str:
    return str(template).replace("{idempotency_key}", idempotency_key)


def _adapter(obj: object, where: str, guard: OutboundGuard | None = None) -> EffectAdapter:
    if inspect.isclass(obj):
        # The http adapter (or one built on it) obeys the executor's outbound guard.
        obj = obj(guard=guard) if issubclass(obj, HttpAdapter) else obj()
    if not all(
        inspect.iscoroutinefunction(getattr(obj, name, None)) for name in ("dispatch", "reconcile")
    ):
        raise RunnerConfigError(f"{where} is not an effect adapter (async dispatch and reconcile)")
    return obj  # type: ignore[return-value]


def load_effects(
    extra: dict[str, object] | None = None, *, guard: OutboundGuard | None = None
) -> dict[str, EffectAdapter]:
    """Every effect adapter this process has: entry points, then `extra`. An
    `HttpAdapter` class is made with `guard` (default: public hosts only); an adapter
    handed over made keeps its own."""
    return load_named(
        ENTRY_POINT_GROUP,
        functools.partial(_adapter, guard=guard),
        what="effect adapter",
        extra=extra,
    )
