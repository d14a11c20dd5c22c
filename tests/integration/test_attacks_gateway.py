"""Attacks on the gateway as an HTTP client: bodies larger than the limit on any route
(declared or chunked: refused while reading, 413), and more requests at once per API key
than the limit (event streams held open: 429), while other keys are served."""

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from runwire.contracts.errors import ErrorCode, ErrorReply
from runwire.testing.waiting import eventually
from tests.gateway import serve_gateway
from tests.services import InProcessStack

pytestmark = [pytest.mark.integration, pytest.mark.security]

KEY = "rw_test-default-key"
OTHER_KEY = "rw_test-acme-key"
LIMIT = 4096
PER_KEY = 2
POST_ROUTES = (
    "/v1/runs",
    "/v1/runs/00000000-0000-0000-0000-000000000000/cancel",
    "/threads",
    "/threads/00000000-0000-0000-0000-000000000000/runs",
    "/threads/00000000-0000-0000-0000-000000000000/runs/stream",
    "/runs/wait",
)


@pytest.fixture
async def gateway(stack: InProcessStack, tmp_path: Path) -> AsyncIterator[str]:
    async with serve_gateway(
        stack.nats_url,
        stack.prefix,
        {KEY: "default", OTHER_KEY: "acme"},
        tmp_path,
        gateway_heartbeat_s=0.3,
        gateway_max_body_bytes=LIMIT,
        gateway_max_requests_per_key=PER_KEY,
    ) as url:
        yield url


def _error(response: httpx.Response) -> tuple[int, ErrorCode, bool]:
    error = ErrorReply.model_validate(response.json()).error
    return response.status_code, error.code, error.retryable


async def test_a_body_over_the_limit_is_refused_on_every_route(gateway: str) -> None:
    big = json.dumps({"input": {"tokens": ["x" * (LIMIT * 2)]}}).encode()
    async with httpx.AsyncClient(base_url=gateway, timeout=10) as http:
        for route in POST_ROUTES:
            response = await http.post(route, content=big, headers={"x-api-key": KEY})
            assert _error(response) == (413, ErrorCode.PAYLOAD_TOO_LARGE, False), route


async def test_a_chunked_body_is_cut_off_once_it_passes_the_limit(gateway: str) -> None:
    # No Content-Length: the body comes in chunks, and the gateway stops reading as soon
    # as it has more than the limit (the client may never finish sending).
    where = urlsplit(gateway)
    reader, writer = await asyncio.open_connection(where.hostname, where.port)
    writer.write(
        b"POST /threads HTTP/1.1\r\nHost: gateway\r\nx-api-key: " + KEY.encode() + b"\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b"x" * 1024
    sent = 0
    try:
        for _ in range(LIMIT // len(chunk) + 2):
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
            sent += len(chunk)
        # Never the closing chunk: a body that never ends is answered all the same.
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    finally:
        writer.close()
    assert head.startswith(b"HTTP/1.1 413"), head
    assert sent <= LIMIT + 2 * len(chunk)


async def test_one_key_cannot_hold_more_than_its_share_of_requests(gateway: str) -> None:
    async with (
        httpx.AsyncClient(base_url=gateway, timeout=10) as http,
        httpx.AsyncClient(base_url=gateway, timeout=10) as other,
    ):
        streams = []
        try:
            for _ in range(PER_KEY):  # event streams held open
                stream = http.stream("GET", "/v1/events", headers={"x-api-key": KEY})
                response = await stream.__aenter__()
                assert response.status_code == 200
                streams.append(stream)
            over = await http.get("/v1/runs/nope", headers={"x-api-key": KEY})
            # Another key is served meanwhile.
            theirs = await other.get("/v1/events/none", headers={"x-api-key": OTHER_KEY})
        finally:
            for stream in streams[1:]:
                await stream.__aexit__(None, None, None)
        assert _error(over) == (429, ErrorCode.QUOTA_EXCEEDED, True)
        assert over.headers["retry-after"] == "1"
        assert theirs.status_code == 404

        # Once one stream closes, the key is served again.
        async def served() -> bool:
            response = await http.get(
                "/v1/runs/00000000-0000-0000-0000-000000000000", headers={"x-api-key": KEY}
            )
            return response.status_code == 404

        await eventually(served)
        await streams[0].__aexit__(None, None, None)
