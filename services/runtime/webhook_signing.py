"""Webhook signatures in the Standard Webhooks format: a tenant's secret, and the
`webhook-signature` header of a delivery (see runwire.contracts.webhooks)."""

import base64
import hashlib
import hmac
import secrets

SECRET_PREFIX = "whsec_"


def new_secret() -> str:
    """A signing secret as Standard Webhooks writes one: `whsec_` and 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header: `v1,` and the base64 HMAC-SHA256 of
    `<id>.<timestamp>.<body>` under the secret's bytes."""
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()
