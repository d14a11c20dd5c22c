"""Signed completion webhooks, delivered at least once.

A run's transition writes a delivery for each endpoint of its tenant that subscribes to
the event (`webhook_put`, in the transition's transaction). Recovery takes the due ones,
each leased so that another replica leaves it alone meanwhile, and POSTs each body signed
in the Standard Webhooks format under the tenant's secret. A 2xx answer delivers it; any
other answer, a timeout or a refused connection is tried again after a backoff that
doubles, up to `webhook_max_attempts`; then it has failed for good and stays to be seen
(`runwire webhooks`). An address the URL policy refuses (private, loopback, link-local
unless the operator allows it) fails at once: trying again would not change it.
"""

import asyncio
import contextlib
import logging
import time
from typing import Any

import httpx

from runwire.runners.outbound import GuardedTransport, OutboundGuard, OutboundRefused
from runwire.runtime.errors import RunwireError
from runwire.runtime.settings import RecoverySettings
from runwire.runtime.store import Store
from runwire.runtime.webhook_signing import signature

log = logging.getLogger(__name__)

# Deliveries taken at once, and sent at once.
BATCH = 100
# A delivery taken is left alone by other replicas this much longer than its timeout.
LEASE_MARGIN_MS = 5_000
# The longest wait between two attempts.
MAX_BACKOFF_MS = 3_600_000
# Delivered ones are kept a day, failed ones a week (to be seen), then forgotten.
KEEP_DELIVERED_S = 86_400
KEEP_FAILED_S = 7 * 86_400


def backoff_ms(settings: RecoverySettings, attempts: int) -> int:
    """The wait after `attempts` failed attempts."""
    return int(min(MAX_BACKOFF_MS, settings.webhook_retry_base_ms * 2 ** (attempts - 1)))


class WebhookDeliveries:
    """Recovery's deliverer of webhooks (see the module)."""

    def __init__(self, settings: RecoverySettings, store: Store) -> None:
        self.settings = settings
        self.store = store
        guard = OutboundGuard.parse(settings.webhook_allow_hosts, settings.webhook_allow_networks)
        self.client = httpx.AsyncClient(
            transport=GuardedTransport(guard),
            timeout=settings.webhook_timeout_ms / 1000,
            follow_redirects=False,
        )
        self._forgotten = 0.0

    async def run(self, stop: asyncio.Event) -> None:
        """Deliver what is due every `webhook_interval_ms` until `stop`."""
        try:
            while not stop.is_set():
                try:
                    while await self.deliver_due() == BATCH and not stop.is_set():
                        pass  # more are due at once
                    if time.monotonic() - self._forgotten > 60:
                        self._forgotten = time.monotonic()
                        await self.store.forget_webhooks(KEEP_DELIVERED_S, KEEP_FAILED_S)
                except RunwireError as exc:
                    log.warning("webhooks not delivered now, trying again: %s", exc.message)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.settings.webhook_interval_ms / 1000)
        finally:
            await self.client.aclose()

    async def deliver_due(self) -> int:
        """Send every delivery due now (up to BATCH); how many were taken."""
        lease = self.settings.webhook_timeout_ms + LEASE_MARGIN_MS
        due = await self.store.webhooks_due(BATCH, lease)
        await asyncio.gather(*(self._deliver(d) for d in due))
        return len(due)

    async def _deliver(self, delivery: dict[str, Any]) -> None:
        body = delivery["body"].encode()
        error, again = await self._post(delivery, body)
        if error is None:
            await self.store.webhook_delivered(delivery["id"])
            return
        attempts = delivery["attempts"] + 1
        again = again and attempts < self.settings.webhook_max_attempts
        log.info(
            "webhook delivery failed (%s), %s",
            error,
            "tried again later" if again else "for good",
            extra={"tenant": delivery["tenant"], "msg_id": delivery["msg_id"]},
        )
        await self.store.webhook_not_delivered(
            delivery["id"], error, again, backoff_ms(self.settings, attempts)
        )

    async def _post(self, delivery: dict[str, Any], body: bytes) -> tuple[str | None, bool]:
        """Send it once: (None, _) delivered, or (what went wrong, whether to try again)."""
        secret = delivery["secret"]
        if secret is None:
            return "the tenant has no signing secret", False
        timestamp = int(time.time())
        headers = {
            "content-type": "application/json",
            "webhook-id": delivery["msg_id"],
            "webhook-timestamp": str(timestamp),
            "webhook-signature": signature(secret, delivery["msg_id"], timestamp, body),
            "user-agent": "runwire-webhooks",
        }
        try:
            answer = await self.client.post(delivery["url"], content=body, headers=headers)
        except OutboundRefused as exc:
            return exc.reason, False
        except httpx.TimeoutException:
            return "no answer in time", True
        except httpx.HTTPError as exc:
            return f"could not be sent ({type(exc).__name__})", True
        if 200 <= answer.status_code < 300:
            return None, False
        return f"answered {answer.status_code}", True
