"""A webhook endpoint for tests: a real HTTP server on loopback that keeps every request
it receives (its headers and its body's bytes) and answers each path with the statuses
queued for it, then 200."""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict, deque
from dataclasses import dataclass


@dataclass
class Delivery:
    """One request the endpoint received."""

    path: str
    headers: dict[str, str]
    body: bytes
    status: int  # what it answered


class WebhookReceiver:
    """`async with WebhookReceiver() as hooks:` listens on `hooks.url(path)`."""

    def __init__(self) -> None:
        self.received: list[Delivery] = []
        self.answers: defaultdict[str, deque[int]] = defaultdict(deque)
        self.always: dict[str, int] = {}
        self._server: asyncio.Server | None = None
        self._base = ""

    def url(self, path: str) -> str:
        return self._base + path

    def fail(self, path: str, *statuses: int) -> None:
        """Answer the next requests to `path` with `statuses`, one each."""
        self.answers[path].extend(statuses)

    def of(self, path: str) -> list[Delivery]:
        return [d for d in self.received if d.path == path]

    async def __aenter__(self) -> WebhookReceiver:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        host, port = self._server.sockets[0].getsockname()[:2]
        self._base = f"http://{host}:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(Exception):
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            _, path, _ = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                name, sep, value = line.partition(":")
                if sep:
                    headers[name.strip().lower()] = value.strip()
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            queued = self.answers[path]
            status = queued.popleft() if queued else self.always.get(path, 200)
            self.received.append(Delivery(path, headers, body, status))
            writer.write(
                f"HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".encode()
            )
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
