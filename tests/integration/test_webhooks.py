"""Signed completion webhooks: delivered at least once with the event's stable id, signed
in the Standard Webhooks format (verified with the `standardwebhooks` library, as a
receiver would), retried with backoff, failed for good and shown after the last attempt;
the URL policy refuses private and link-local addresses unless the operator allows them."""

import json
from typing import Any

import pytest
from standardwebhooks import Webhook

from runwire.contracts.status import RunStatus
from runwire.contracts.webhooks import WebhookPayload
from tests.services import InProcessStack, collect, eventually
from tests.waiting import hears
from tests.webhook_receiver import WebhookReceiver

pytestmark = pytest.mark.integration

# Loopback is where the test's endpoint listens: allowed, and nothing else private.
HOOKS = {
    "webhook_allow_networks": "127.0.0.0/8",
    "webhook_retry_base_ms": 100,
    "webhook_interval_ms": 50,
    "webhook_max_attempts": 3,
}


async def test_run_events_are_delivered_signed_retried_and_failures_kept(
    infra: Any, db_url: str, prefix: str
) -> None:
    async with (
        WebhookReceiver() as hooks,
        InProcessStack(
            infra.nats_url, db_url, prefix, db_roles=infra.service_roles, overrides=HOOKS
        ) as stack,
    ):
        client = stack.client
        made = await client.set_webhooks(
            [
                {"url": hooks.url("/ended"), "events": ["ended"]},
                {"url": hooks.url("/all"), "events": ["ended", "waiting"]},
                {"url": hooks.url("/down"), "events": ["ended"]},
                # Cloud metadata's address: the URL policy refuses it, at once.
                {"url": "http://169.254.169.254/latest/meta-data", "events": ["ended"]},
            ]
        )
        assert made.secret is not None
        assert made.secret.startswith("whsec_")
        again = await client.set_webhooks([e.model_dump() for e in made.endpoints])
        assert again.secret is None  # shown once: the same secret signs on
        hooks.fail("/ended", 500, 503)  # the third attempt gets through
        hooks.always["/down"] = 500

        run_id = (await client.submit({"tokens": ["hi"]})).run.run_id
        await collect(client, run_id)

        def settled() -> bool:
            return len(hooks.of("/ended")) == 3 and len(hooks.of("/down")) == 3

        await eventually(settled, timeout=20)
        shown = await eventually(lambda: _all_failed(client, 2), timeout=10)

    verifier = Webhook(made.secret)
    tries = hooks.of("/ended")
    assert [t.status for t in tries] == [500, 503, 200]
    # One event: the same id on every try, each try signed anew (and verified).
    assert len({t.headers["webhook-id"] for t in tries}) == 1
    for attempt in tries:
        verified = verifier.verify(attempt.body, attempt.headers)
        assert verified == json.loads(attempt.body)
    payload = WebhookPayload.model_validate_json(tries[-1].body)
    assert payload.type == "run.ended"
    assert (payload.data.run_id, payload.data.status) == (run_id, RunStatus.FINISHED)
    # Nobody else's secret verifies it.
    with pytest.raises(Exception, match="signature"):
        Webhook("whsec_" + "A" * 43 + "=").verify(tries[-1].body, tries[-1].headers)
    # The endpoint that hears every event heard the one event there was, once.
    (only,) = hooks.of("/all")
    assert only.headers["webhook-id"] == tries[0].headers["webhook-id"]

    failed = {f.url: f for f in shown.failed}
    down = failed[hooks.url("/down")]
    assert (down.attempts, down.error, down.event) == (3, "answered 500", "ended")
    metadata = failed["http://169.254.169.254/latest/meta-data"]
    assert metadata.attempts == 1
    assert "link-local" in str(metadata.error)
    assert shown.pending == 0


async def _all_failed(client: Any, failed: int) -> Any:
    shown = await client.webhooks()
    assert (len(shown.failed), shown.pending) == (failed, 0), shown
    return shown


async def test_a_run_that_waits_tells_its_endpoint(infra: Any, db_url: str, prefix: str) -> None:
    async with (
        WebhookReceiver() as hooks,
        InProcessStack(
            infra.nats_url,
            db_url,
            prefix,
            db_roles=infra.service_roles,
            overrides=HOOKS,
            runners={"hears": hears},
        ) as stack,
    ):
        client = stack.client
        made = await client.set_webhooks([{"url": hooks.url("/w"), "events": ["waiting"]}])
        run_id = (await client.submit({}, runner="hears")).run.run_id
        await eventually(lambda: len(hooks.of("/w")) == 1, timeout=20)
        assert (await client.get(run_id)).status == RunStatus.WAITING
        await client.cancel(run_id)
    (delivery,) = hooks.of("/w")
    assert made.secret is not None
    Webhook(made.secret).verify(delivery.body, delivery.headers)
    payload = WebhookPayload.model_validate_json(delivery.body)
    assert (payload.type, payload.data.run_id) == ("run.waiting", run_id)
    assert payload.data.status == RunStatus.WAITING
