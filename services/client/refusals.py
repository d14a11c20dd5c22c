"""The broker's refusals on one client connection: which operations it dropped, and why.

A broker that enforces identities drops a publish or a subscription it refuses and says
so a moment later, asynchronously, on the connection (nats-server's `-ERR` line); a
request sent meanwhile would only time out. The client watches a request's subject
here and answers UNAUTHORIZED as soon as the refusal arrives.
"""

import asyncio
import logging
import re

log = logging.getLogger(__name__)

# How the broker says no (nats-server's -ERR line): the operation and its subject.
_VIOLATION = re.compile(r"permissions violation for (publish|subscription) to \"?([^\"']+)", re.I)


class Refusals:
    """The broker's refusals on one connection, as they arrive (asynchronously: a publish
    it refuses is dropped, and the connection hears why a moment later)."""

    def __init__(self) -> None:
        self._waiting: dict[str, list[asyncio.Future[str]]] = {}
        # Set when the broker refused the connection's credentials.
        self.credentials_refused = asyncio.Event()

    async def on_error(self, exc: Exception) -> None:
        if "authorization violation" in str(exc).lower():
            self.credentials_refused.set()
            return
        found = _VIOLATION.search(str(exc))
        if found is None:
            # nats-py prints a traceback for every failed attempt by default; one line.
            log.debug("NATS connection error: %s", exc)
            return
        subject = found.group(2).strip()
        for future in self._waiting.pop(subject, []):
            if not future.done():
                action = "publish" if found.group(1).lower() == "publish" else "subscribe"
                future.set_result(f"the broker does not let this identity {action} to {subject}")

    def watch(self, subject: str) -> "asyncio.Future[str]":
        """A future set when the broker refuses an operation on `subject`."""
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(subject, []).append(future)
        return future

    def forget(self, subject: str, future: "asyncio.Future[str]") -> None:
        waiting = self._waiting.get(subject, [])
        if future in waiting:
            waiting.remove(future)
        if not waiting:
            self._waiting.pop(subject, None)
