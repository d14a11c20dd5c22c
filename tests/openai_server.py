"""An OpenAI-compatible HTTP server for tests: real TCP, real HTTP/1.1, chunked SSE.

A test queues what the next requests get (`Stream`, `Status`); the server records each
request (body, headers, when it came, when the client closed the connection). Streams
are sent as a provider sends them: `data: {chunk}` events in a chunked body ending with
`data: [DONE]`, and can be cut (the connection dropped mid-body) or stalled (no more
bytes until the client gives up).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Stream:
    """A streamed answer: `chunks` (chat.completion.chunk bodies) one by one."""

    chunks: list[dict[str, Any]]
    delay_s: float = 0.0
    # Drop the connection after this many chunks (no [DONE], no end of the body).
    cut_after: int | None = None
    # Send nothing more after this many chunks, until the client closes the connection.
    stall_after: int | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Status:
    """An error answer: a status, an OpenAI-style error body and headers."""

    code: int
    message: str = "error"
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Request:
    """One request the server received."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    at: float
    closed_at: float | None = None
    closed: asyncio.Event = field(default_factory=asyncio.Event)


def chunk(
    *,
    content: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    finish: str | None = None,
    usage: dict[str, int] | None = None,
    model: str = "test-model",
) -> dict[str, Any]:
    """A chat.completion.chunk body."""
    delta: dict[str, Any] = {}
    if content is not None:
        delta["content"] = content
    if tool_calls is not None:
        delta["tool_calls"] = tool_calls
    choices = (
        []
        if usage is not None
        else [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
    )
    body: dict[str, Any] = {
        "id": "chatcmpl-test",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": model,
        "choices": choices,
    }
    if usage is not None:
        body["usage"] = usage
    return body


def text_answer(
    *pieces: str, prompt_tokens: int = 10, completion_tokens: int | None = None
) -> list[dict[str, Any]]:
    """Chunks of a text answer: a role chunk, the pieces, `stop`, then the usage."""
    done = completion_tokens if completion_tokens is not None else len(pieces)
    return [
        chunk(content=""),
        *(chunk(content=p) for p in pieces),
        chunk(finish="stop"),
        chunk(usage=_usage(prompt_tokens, done)),
    ]


def tool_call_answer(
    call_id: str, name: str, arguments: str, *, prompt_tokens: int = 10
) -> list[dict[str, Any]]:
    """Chunks of one tool call, its arguments split in fragments as providers send them."""
    half = len(arguments) // 2
    return [
        chunk(
            tool_calls=[
                {
                    "index": 0,
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": ""},
                }
            ]
        ),
        chunk(tool_calls=[{"index": 0, "function": {"arguments": arguments[:half]}}]),
        chunk(tool_calls=[{"index": 0, "function": {"arguments": arguments[half:]}}]),
        chunk(finish="tool_calls"),
        chunk(usage=_usage(prompt_tokens, 5)),
    ]


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


Reply = Stream | Status | Callable[["Request"], Stream | Status]

# A provider's rate-limit window.
MINUTE_S = 60.0


@dataclass
class TokenLimit:
    """A provider's limit in tokens per minute, as strict as one can be: the tokens of
    the requests that arrived in any 60 s (each counted at its arrival, with the usage it
    is answered with) never exceed `tpm`; a request that would is answered 429, with
    `Retry-After` and the rate-limit headers, and counts nothing."""

    tpm: int
    # (arrival, tokens) of each request answered.
    taken: list[tuple[float, int]] = field(default_factory=list)
    refused: int = 0

    def used(self, now: float) -> int:
        return sum(t for at, t in self.taken if at > now - MINUTE_S)

    def until_room(self, now: float, tokens: int) -> float:
        """Seconds until `tokens` more fit."""
        over = self.used(now) + tokens - self.tpm
        for at, t in self.taken:
            if at > now - MINUTE_S:
                over -= t
                if over <= 0:
                    return at + MINUTE_S - now
        return MINUTE_S

    def headers(self, now: float, tokens: int) -> dict[str, str]:
        """The rate-limit headers of an answer (after `tokens` more were taken)."""
        left = max(0, self.tpm - self.used(now) - tokens)
        reset = self.until_room(now, self.tpm - left) if left < self.tpm else 0.0
        return {
            "x-ratelimit-limit-tokens": str(self.tpm),
            "x-ratelimit-remaining-tokens": str(left),
            "x-ratelimit-reset-tokens": f"{max(reset, 0.001):.3f}s",
        }

    def tokens_in(self, start: float, end: float) -> int:
        """The tokens of the requests answered that arrived from `start` to before `end`."""
        return sum(t for at, t in self.taken if start <= at < end)


def _tokens(reply: Stream) -> int:
    """The tokens a streamed answer reports using (its usage chunk)."""
    return sum(c["usage"]["total_tokens"] for c in reply.chunks if c.get("usage") is not None)


class OpenAIServer:
    """`async with OpenAIServer() as server:` serves on `server.base_url`. A queued reply
    may be a function of the request (to answer what a resumed request asks)."""

    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        # What a request gets when nothing is queued.
        self.default: Reply = Stream(text_answer("ok"))
        # A token limit the server enforces, if any.
        self.limit: TokenLimit | None = None
        self.requests: list[Request] = []
        self.arrived = asyncio.Condition()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def base_url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

    def queue(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    async def wait_for_requests(self, count: int, timeout: float = 20) -> list[Request]:
        async with self.arrived:
            await asyncio.wait_for(
                self.arrived.wait_for(lambda: len(self.requests) >= count), timeout
            )
        return self.requests[:count]

    async def wait_for(self, check: Callable[[Request], bool], timeout: float = 20) -> Request:
        """The first request `check` holds for, once one arrived."""
        async with self.arrived:
            await asyncio.wait_for(
                self.arrived.wait_for(lambda: any(check(r) for r in self.requests)), timeout
            )
        return next(r for r in self.requests if check(r))

    async def __aenter__(self) -> OpenAIServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(Exception):
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._one(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        _, path, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        request = Request(path, headers, json.loads(body or b"{}"), time.monotonic())
        async with self.arrived:
            self.requests.append(request)
            self.arrived.notify_all()
        watcher = asyncio.create_task(self._watch_close(reader, request))
        try:
            reply = self.replies.popleft() if self.replies else self.default
            if callable(reply):
                reply = reply(request)
            if isinstance(reply, Stream) and self.limit is not None:
                reply = self._limited(reply, request.at)
            if isinstance(reply, Status):
                await self._status(writer, reply)
            else:
                await self._stream(writer, reply, request)
        finally:
            watcher.cancel()

    def _limited(self, reply: Stream, now: float) -> Stream | Status:
        """`reply` within the token limit, or a 429."""
        assert self.limit is not None
        tokens = _tokens(reply)
        if self.limit.used(now) + tokens > self.limit.tpm:
            self.limit.refused += 1
            wait = self.limit.until_room(now, tokens)
            headers = {**self.limit.headers(now, 0), "retry-after-ms": str(round(wait * 1000))}
            return Status(429, "Rate limit reached for tokens per min (TPM)", headers)
        headers = self.limit.headers(now, tokens)
        self.limit.taken.append((now, tokens))
        return Stream(reply.chunks, reply.delay_s, reply.cut_after, reply.stall_after, headers)

    @staticmethod
    async def _watch_close(reader: asyncio.StreamReader, request: Request) -> None:
        # The client sends nothing more on this connection: EOF means it closed it.
        with contextlib.suppress(ConnectionError):
            await reader.read()
        request.closed_at = time.monotonic()
        request.closed.set()

    @staticmethod
    async def _status(writer: asyncio.StreamWriter, reply: Status) -> None:
        body = json.dumps(
            {"error": {"message": reply.message, "type": "test_error", "code": None}}
        ).encode()
        extra = "".join(f"{k}: {v}\r\n" for k, v in reply.headers.items())
        writer.write(
            f"HTTP/1.1 {reply.code} Error\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n{extra}\r\n".encode()
            + body
        )
        await writer.drain()

    @staticmethod
    async def _stream(writer: asyncio.StreamWriter, reply: Stream, request: Request) -> None:
        extra = "".join(f"{k}: {v}\r\n" for k, v in reply.headers.items())
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\nconnection: close\r\n" + extra.encode() + b"\r\n"
        )
        await writer.drain()

        def event(data: str) -> bytes:
            payload = f"data: {data}\n\n".encode()
            return f"{len(payload):x}\r\n".encode() + payload + b"\r\n"

        for sent, body in enumerate(reply.chunks):
            if reply.cut_after is not None and sent == reply.cut_after:
                writer.transport.abort()  # the connection drops mid-body
                return
            if reply.stall_after is not None and sent == reply.stall_after:
                await request.closed.wait()
                return
            writer.write(event(json.dumps(body)))
            await writer.drain()
            if reply.delay_s:
                await asyncio.sleep(reply.delay_s)
        writer.write(event("[DONE]") + b"0\r\n\r\n")
        await writer.drain()
