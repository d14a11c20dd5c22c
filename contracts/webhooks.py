"""Signed completion webhooks: a tenant's endpoints and what runwire posts to them.

Each delivery is a POST of a `WebhookPayload` (JSON), signed in the Standard Webhooks
format: headers `webhook-id` (the event's stable id: the same on every retry),
`webhook-timestamp` (Unix seconds) and `webhook-signature` (`v1,` and the base64
HMAC-SHA256 of `<id>.<timestamp>.<body>` under the tenant's secret, `whsec_...`).
"""

from enum import StrEnum

from pydantic import AwareDatetime, Field

from runwire.contracts.base import WireModel
from runwire.contracts.errors import ErrorBody
from runwire.contracts.status import RunStatus

# Endpoints a tenant may have.
MAX_ENDPOINTS = 10
MAX_URL_LENGTH = 2048


class WebhookEvent(StrEnum):
    """What a webhook tells: a run ended (finished, failed, canceled or interrupted), or
    waits for an answer, a signal or a timer."""

    ENDED = "ended"
    WAITING = "waiting"


class WebhookEndpoint(WireModel):
    """Where deliveries go (`http` or `https`), and for which events."""

    url: str = Field(pattern=r"^https?://[^\s/?#]+[^\s]*$", max_length=MAX_URL_LENGTH)
    events: list[WebhookEvent] = Field(min_length=1, max_length=len(WebhookEvent))


class WebhookFailure(WireModel):
    """A delivery that failed for good (its last attempt failed, or the URL policy refused
    its address): kept to be seen."""

    msg_id: str
    url: str
    event: WebhookEvent
    attempts: int
    error: str | None
    at: AwareDatetime


class WebhookRunData(WireModel):
    """The run a webhook tells of, as it was at the event."""

    run_id: str
    tenant: str
    session_id: str | None = None
    runner: str
    status: RunStatus
    attempts: int
    error: ErrorBody | None = None
    created_at: AwareDatetime
    ended_at: AwareDatetime | None = None


class WebhookPayload(WireModel):
    """The body of a delivery: `type` is `run.ended` or `run.waiting`."""

    type: str
    timestamp: AwareDatetime
    data: WebhookRunData
