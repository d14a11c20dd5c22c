"""Raw-frame tokens: what makes an attempt's frames impossible to forge.

Each run has a secret, made by Postgres when the run is created (`runs.frame_secret`),
that only the services read. The attempt of generation G signs its raw frames with
`frame_token(secret, G)`: in the frame (`token`) and in its message id. The relay keeps a
frame only if its token is the one of its generation (and Postgres has claimed that
generation). The same function is `frame_token` in SQL, for the closing frames that
Postgres writes to the outbox.
"""

import hashlib
import hmac

# How much of the token a message id carries: enough that nobody guesses it.
ID_TOKEN_CHARS = 16


def frame_token(secret: str, generation: int) -> str:
    """The token of the frames of `generation` of the run whose secret is `secret`."""
    return hashlib.sha256(f"{secret}:{generation}".encode()).hexdigest()


def raw_frame_id(run_id: str, generation: int, seq: int, token: str | None) -> str:
    """A raw frame's `Nats-Msg-Id`: stable for a repeat, unknowable without the token."""
    base = f"{run_id}:{generation}:{seq}"
    return f"{base}:{token[:ID_TOKEN_CHARS]}" if token else base


def authentic(token: str | None, secret: str | None, generation: int) -> bool:
    """Whether a frame's token is its generation's (a run without a secret, created by an
    older runwire, has tokenless frames)."""
    if secret is None:
        return token is None
    return token is not None and hmac.compare_digest(token, frame_token(secret, generation))
