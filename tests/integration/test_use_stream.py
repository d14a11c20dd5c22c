"""A real front end, unchanged: a chat page built on the LangGraph SDK's `useStream` React
hook (tests/node/use_stream/, bundled by esbuild) in headless Chromium, served from an
origin of its own, talks first to LangGraph's own server and then to the gateway (CORS
allowed for that origin). What its user sees must be the same on both: a message sent
streams in, a reload in the middle of the stream picks the run up where it is (no token
lost or repeated), an interrupt's question shows and its answer finishes the run, and a
reload at rest shows the thread as it is."""

import asyncio
import shutil
import threading
from collections.abc import AsyncIterator, Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from playwright.async_api import Browser, Page, expect

from runwire.testing.waiting import eventually
from tests.gateway import serve_gateway
from tests.nodejs import NODE_DIR, bundle
from tests.reference import same
from tests.services import InProcessStack

pytestmark = [
    pytest.mark.integration,
    pytest.mark.stack(runners="chat=tests.reference.twin:chat", coalesce_text=False),
    pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed"),
]

KEY = "rw_test-use-stream"
# A shared, busy machine: give the page time.
expect.set_options(timeout=30_000)
TOKENS = [f"w{i} " for i in range(30)]
ANSWERED = "sure you said yes"


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The page, bundled, served from its own loopback origin."""
    folder = tmp_path_factory.mktemp("use-stream")
    bundle(NODE_DIR / "use_stream" / "page.jsx", folder / "page.js")
    shutil.copy(NODE_DIR / "use_stream" / "index.html", folder / "index.html")
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
async def gateway(stack: InProcessStack, tmp_path: Path, site: str) -> AsyncIterator[str]:
    async with serve_gateway(
        stack.nats_url, stack.prefix, {KEY: "default"}, tmp_path, gateway_cors_origins=[site]
    ) as url:
        yield url


async def _messages(page: Page) -> list[tuple[str | None, str]]:
    items = page.locator("#messages li")
    return [
        (await item.get_attribute("data-type"), await item.text_content() or "")
        for item in await items.all()
    ]


async def _send(page: Page, message: str, reply: list[str], **more: str) -> None:
    await page.fill("#message", message)
    await page.fill("#reply", "|".join(reply))
    for field, value in more.items():
        await page.fill(f"#{field}", value)
    await page.click("#send")


async def _part_shows(page: Page) -> None:
    """It streams: part of the answer shows while the run goes on."""
    await page.wait_for_function(
        "n => { const ai = document.querySelector('#messages li[data-type=ai]');"
        " return ai !== null && ai.textContent.length >= 12 && ai.textContent.length < n }",
        arg=len("".join(TOKENS)) - 12,
    )


async def _chat(browser: Browser, site: str, api: str, key: str) -> list[tuple[str, Any]]:
    """The user's session on one server: what they saw at each step."""
    seen: list[tuple[str, Any]] = []
    page = await browser.new_page()
    failures: list[str] = []
    page.on("pageerror", lambda error: failures.append(str(error)))
    try:
        await page.goto(f"{site}/?{urlencode({'api': api, 'key': key, 'assistant': 'chat'})}")
        full = "".join(TOKENS)
        await _send(page, "hi", TOKENS, delay="150")
        answer = page.locator("#messages li[data-type=ai]")
        await _part_shows(page)
        seen.append(("streaming", await page.locator("#status").text_content()))
        await page.reload()
        await expect(answer).to_have_text(full)
        await expect(page.locator("#status")).to_have_text("idle")
        seen.append(("after a reload mid-stream", await _messages(page)))
        await _send(page, "go on?", ["sure"], ask="Proceed?", delay="0")
        await expect(page.locator("#question")).to_have_text("Proceed?")
        seen.append(("asked", await _messages(page)))
        await page.fill("#answer", "yes")
        await page.click("#resume")
        await expect(answer.last).to_have_text(ANSWERED)
        await expect(page.locator("#status")).to_have_text("idle")
        await expect(page.locator("#interrupt")).to_have_count(0)
        seen.append(("answered", await _messages(page)))
        await page.reload()
        await expect(answer.last).to_have_text(ANSWERED)
        seen.append(("reloaded at rest", await _messages(page)))
        seen.append(("errors", await page.locator("#errors li").all_text_contents()))
        seen.append(("page errors", failures))
        return seen
    finally:
        await page.close()


async def _left(browser: Browser, site: str, api: str, key: str) -> list[tuple[str, Any]]:
    """A page that does not reconnect (the hook's default) reloaded mid-stream: the run
    stops, and the thread goes on with the next message."""
    seen: list[tuple[str, Any]] = []
    page = await browser.new_page()
    query = urlencode({"api": api, "key": key, "assistant": "chat", "reconnect": "0"})
    headers = {"x-api-key": key} if key else {}
    try:
        await page.goto(f"{site}/?{query}")
        await _send(page, "hi", TOKENS, delay="150")
        await _part_shows(page)
        thread_id = await page.evaluate("sessionStorage.getItem('chat:thread')")
        await page.reload()
        async with httpx.AsyncClient(base_url=api, headers=headers, timeout=30) as http:

            async def stopped() -> str:
                runs = (await http.get(f"/threads/{thread_id}/runs")).json()
                return runs[0]["status"] if runs[0]["status"] not in ("pending", "running") else ""

            seen.append(("the run, its page gone", await eventually(stopped, timeout=20)))
        await page.reload()
        # The thread as the stopped run left it: its input, no answer.
        await expect(page.locator("#messages li")).to_have_text(["hi"])
        await expect(page.locator("#status")).to_have_text("idle")
        seen.append(("reloaded", await _messages(page)))
        await _send(page, "again", ["ok"], delay="0")
        await expect(page.locator("#messages li").last).to_have_text("ok")
        await expect(page.locator("#status")).to_have_text("idle")
        seen.append(("the next turn", await _messages(page)))
        return seen
    finally:
        await page.close()


async def test_a_use_stream_page_sees_the_gateway_as_langgraphs_server(
    browser: Browser, site: str, reference: str, gateway: str
) -> None:
    theirs, ours = await asyncio.gather(
        _chat(browser, site, reference, ""), _chat(browser, site, gateway, KEY)
    )
    # What a user saw, the same as LangGraph's own server shows them.
    assert ("after a reload mid-stream", [("human", "hi"), ("ai", "".join(TOKENS))]) in ours
    assert ours[-1] == ("page errors", [])
    same(theirs, ours)


async def test_a_page_that_does_not_reconnect_stops_its_run_on_both(
    browser: Browser, site: str, reference: str, gateway: str
) -> None:
    theirs, ours = await asyncio.gather(
        _left(browser, site, reference, ""), _left(browser, site, gateway, KEY)
    )
    assert ours[0] == ("the run, its page gone", "interrupted")
    same(theirs, ours)
