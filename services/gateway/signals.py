"""Signal URLs: a URL a third party (a payment provider's webhook, a CI system) may POST
to without an API key, to send one run one signal. The URL carries an unguessable token,
an HMAC of the tenant, the run and the signal's name under the gateway's secret
(`RUNWIRE_GATEWAY_SIGNAL_SECRET`): it signals that run that signal and nothing else, and
no state is kept to check it."""

import base64
import hashlib
import hmac


def signal_token(secret: str, tenant: str, run_id: str, name: str) -> str:
    """The token of the signal URL of (`tenant`, `run_id`, `name`)."""
    message = "\n".join((tenant, run_id, name)).encode()
    mac = hmac.new(secret.encode(), message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


def token_fits(secret: str, tenant: str, run_id: str, name: str, token: str) -> bool:
    """Whether `token` is that signal URL's (in constant time)."""
    return hmac.compare_digest(signal_token(secret, tenant, run_id, name), token)
