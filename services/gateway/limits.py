"""What one HTTP client may take of the gateway: a body no larger than the limit, checked
while it is read on every route (a `Content-Length` over the limit is refused before a
byte of the body is read; a chunked body as soon as it passes the limit), and no more
requests in flight at once per API key than the limit, event streams included (each open
stream is one request for as long as it lasts).

An ASGI middleware, outside every route, so that no route can forget it: 413
`PAYLOAD_TOO_LARGE` (not retryable: the same body is refused again) and 429
`QUOTA_EXCEEDED` (retryable: once the key's other requests end), in the wire's error
body. The process as a whole is bounded by uvicorn's `limit_concurrency` (503 past it).
"""

import hashlib
from collections import Counter
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from runwire.contracts.errors import ErrorBody, ErrorCode, ErrorReply
from runwire.gateway.errors import status_of

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value)
    return None


def key_of(scope: Scope) -> str | None:
    """A digest of the request's API key (never the key itself), or None."""
    given = _header(scope, b"x-api-key")
    if given is None:
        auth = _header(scope, b"authorization") or b""
        scheme, _, token = auth.partition(b" ")
        given = token.strip() if scheme.lower() == b"bearer" else None
    return hashlib.sha256(given).hexdigest() if given else None


async def _refuse(send: Send, code: ErrorCode, message: str, *, retryable: bool) -> None:
    error = ErrorBody(code=code, message=message, retryable=retryable)
    body = ErrorReply(error=error).model_dump_json().encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    if code == ErrorCode.QUOTA_EXCEEDED:
        headers.append((b"retry-after", b"1"))
    await send({"type": "http.response.start", "status": status_of(error), "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Limits:
    """The middleware (see the module)."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, max_per_key: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_per_key = max_per_key
        self.in_flight: Counter[str] = Counter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _header(scope, b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_body_bytes):
            await self._too_large(send, declared.decode("latin-1")[:20])
            return
        key = key_of(scope)
        if key is not None and self.in_flight[key] >= self.max_per_key:
            await _refuse(
                send,
                ErrorCode.QUOTA_EXCEEDED,
                f"this API key has {self.max_per_key} requests open (event streams "
                "included): close one, or try again later",
                retryable=True,
            )
            return
        if key is not None:
            self.in_flight[key] += 1
        try:
            body = await self._read(receive)
            if body is None:
                await self._too_large(send, f"over {self.max_body_bytes}")
                return
            await self.app(scope, _replay(body, receive), send)
        finally:
            if key is not None:
                self.in_flight[key] -= 1
                if self.in_flight[key] <= 0:
                    del self.in_flight[key]

    async def _read(self, receive: Receive) -> bytes | None:
        """The whole body, or None once it passes the limit (nothing more is read)."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return b"".join(chunks)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _too_large(self, send: Send, size: str) -> None:
        await _refuse(
            send,
            ErrorCode.PAYLOAD_TOO_LARGE,
            f"a body of {size} bytes is over the limit of {self.max_body_bytes}",
            retryable=False,
        )


def _replay(body: bytes, receive: Receive) -> Receive:
    """`receive` that gives the body read already, then what the client sends next (its
    disconnect, which a streaming route waits for)."""
    given = False

    async def replayed() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
