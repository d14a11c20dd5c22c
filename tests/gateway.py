"""The gateway under uvicorn in the test's event loop, on a free loopback port."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from runwire.contracts.frames import Frame
from runwire.gateway.app import create_app
from runwire.gateway.keys import add_key
from runwire.gateway.settings import GatewaySettings


@asynccontextmanager
async def serve_gateway(
    nats_url: str, prefix: str, keys: dict[str, str], folder: Path, **settings: Any
) -> AsyncIterator[str]:
    """A gateway accepting `keys` (key → tenant); yields its base URL."""
    keys_file = folder / "api-keys.json"
    for key, tenant in keys.items():
        add_key(keys_file, tenant, key)
    app = create_app(
        GatewaySettings(nats_url=nats_url, prefix=prefix, gateway_keys_file=keys_file, **settings)
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 15)
        sock.close()


async def sse_frames(
    response: httpx.Response, limit: int | None = None
) -> AsyncIterator[tuple[str | None, Frame]]:
    """The frames of an event stream (with each event's id), at most `limit` of them."""
    event: dict[str, str] = {}
    seen = 0
    async for line in response.aiter_lines():
        if line.startswith(":"):
            continue
        if line == "":
            if "data" in event:
                yield event.get("id"), Frame.model_validate(json.loads(event["data"]))
                seen += 1
                if limit is not None and seen >= limit:
                    return
            event = {}
            continue
        name, _, value = line.partition(":")
        event[name] = value.removeprefix(" ")
