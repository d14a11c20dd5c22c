"""A payment-like and mail-like HTTP endpoint for effect tests (real TCP, HTTP/1.1).

`POST /charge` performs a charge once per `Idempotency-Key` (a repeat answers with the
first receipt) and refuses a `Runwire-Fence-Token` lower than the highest it has seen for
the key (409). `GET /charges/<key>`: 200 with the receipt, 404 if never charged. A test
can make it hold its answer to a charge (`hold`), as a slow provider would. `POST /email`
sends an email the same way (once per key; `emails` counts them, receipts `em_<n>`).
`GET /emails/<key>` answers as `/charges/<key>` does. `requests` lists every request that
arrived, whatever it asked; `redirects` maps a path to the URL a request for it is sent
on to (307: the same method and body). `lose_answers`: that many charges or emails are
performed, then answered 502 (the answer was lost); `drop_status`: that many status
requests get their connection closed without an answer; `pending_status`: that many
status requests are answered 202 (the outcome is pending) before the truth.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from typing import Any


class EffectServer:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request
        self.redirects: dict[str, str] = {}  # path -> where a request for it is redirected
        self.charges: Counter[str] = Counter()  # charges performed, per idempotency key
        self.emails: Counter[str] = Counter()  # emails sent, per idempotency key
        self.sent: dict[str, dict[str, Any]] = {}  # what each email said, by receipt id
        self.receipts: dict[str, dict[str, Any]] = {}
        self.fences: dict[str, int] = {}
        self.refused: list[tuple[str, int]] = []
        self.received = asyncio.Event()  # a charge request arrived
        self.hold = False  # answer no charge request (it is performed all the same)
        self.fail_with: int | None = None  # answer charges with this status, charging nothing
        self.lose_answers = 0  # performed, then answered 502, this many more times
        self.drop_status = 0  # status requests to drop without an answer
        self.pending_status = 0  # status requests to answer 202 (pending) first
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def __aenter__(self) -> EffectServer:
        self._server = await asyncio.start_server(self._serve, self.host, 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode()
            method, path, _ = head.split("\r\n", 1)[0].split(" ", 2)
            headers = {
                k.strip().lower(): v.strip()
                for k, _, v in (line.partition(":") for line in head.split("\r\n")[1:] if line)
            }
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            self.requests.append((method, path))
            location = self.redirects.get(path)
            status, answer = (
                (307, {"error": "moved", "detail": "redirect-body"})
                if location is not None
                else await self._answer(method, path, headers, body)
            )
            if status is None:
                await asyncio.Event().wait()  # held: the caller never hears back
            if status == 0:
                return  # dropped: the connection closes without an answer
            payload = json.dumps(answer).encode()
            extra = f"location: {location}\r\n" if location is not None else ""
            writer.write(
                f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n{extra}"
                f"content-length: {len(payload)}\r\nconnection: close\r\n\r\n".encode()
                + payload
            )
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    def _email(self, key: str, message: dict[str, Any]) -> dict[str, Any]:
        """Send the email of `key`, once."""
        if key not in self.receipts:
            self.emails[key] += 1
            receipt = {"id": f"em_{sum(self.emails.values())}"}
            self.receipts[key] = receipt
            self.sent[receipt["id"]] = message
        return self.receipts[key]

    async def _answer(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int | None, dict[str, Any]]:
        if method == "GET" and path.startswith(("/charges/", "/emails/")):
            if self.drop_status > 0:
                self.drop_status -= 1
                return 0, {}
            if self.pending_status > 0:
                self.pending_status -= 1
                return 202, {"status": "pending"}
            receipt = self.receipts.get(path.rsplit("/", 1)[-1])
            return (200, receipt) if receipt is not None else (404, {"error": "not found"})
        if method == "POST" and path in ("/charge", "/email"):
            key = headers["idempotency-key"]
            fence = int(headers["runwire-fence-token"])
            if fence < self.fences.get(key, 0):
                self.refused.append((key, fence))
                return 409, {"error": f"fence {fence} is stale"}
            self.fences[key] = fence
            if path == "/email":
                return self._lost_or(200), self._email(key, json.loads(body))
            if self.fail_with is not None:
                return self.fail_with, {"error": "the payment service is down"}
            if json.loads(body)["amount"] > 1000:
                return 402, {"error": "card declined"}
            if key not in self.receipts:
                self.charges[key] += 1
                amount = json.loads(body)["amount"]
                self.receipts[key] = {"id": f"ch_{len(self.receipts) + 1}", "amount": amount}
            self.received.set()
            return (None if self.hold else self._lost_or(200)), self.receipts[key]
        return 404, {"error": "not found"}

    def _lost_or(self, status: int) -> int:
        """502 while answers are to be lost (the action was performed all the same)."""
        if self.lose_answers > 0:
            self.lose_answers -= 1
            return 502
        return status
