"""The web console in headless Chromium (Debian's, driven by Playwright): submit a run,
watch its text stream, reload the page mid-stream, and find the final text exact."""

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, async_playwright, expect

from tests.gateway import serve_gateway
from tests.services import InProcessStack

pytestmark = pytest.mark.integration

KEY = "rw_test-console-key"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Headless, as root, on a machine without a network beyond loopback.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# A shared, busy machine: give the page time.
expect.set_options(timeout=20_000)
# Where the gateway page's screenshot comes from (RUNWIRE_SCREENSHOT=path to write one).
SCREENSHOT = os.environ.get("RUNWIRE_SCREENSHOT")


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    assert shutil.which(CHROMIUM), "the browser tests need Chromium: `make test` installs it"
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield launched
        finally:
            await launched.close()


async def test_the_console_streams_a_run_and_goes_on_after_a_reload(
    stack: InProcessStack, tmp_path: Path, browser: Browser
) -> None:
    tokens = [f"word{i} " for i in range(40)]
    async with serve_gateway(stack.nats_url, stack.prefix, {KEY: "default"}, tmp_path) as url:
        page = await browser.new_page()
        await page.goto(url + "/")
        await page.fill("#key", KEY)
        await page.dispatch_event("#key", "change")
        script = '{"tokens": [' + ", ".join(f'"{t}"' for t in tokens) + '], "token_delay_ms": 60}'
        await page.fill("#input", script)
        await page.click("button[type=submit]")

        text = page.locator("#text")
        await expect(text).to_contain_text("word5 ", timeout=20_000)
        # Mid-stream: the page is reloaded (what a person does), and goes on from the
        # last frame it showed.
        assert "word39" not in (await text.inner_text())
        await page.reload()
        await expect(page.locator("#run-status")).to_have_text("finished", timeout=30_000)
        await expect(text).to_have_text("".join(tokens).strip(), timeout=10_000)
        assert await text.inner_text() == "".join(tokens)
        # The run is in the list of recent runs, from the run events, and its timeline
        # shows its one attempt and its end.
        await expect(page.locator("#runs tr.run").first).to_contain_text("finished")
        await expect(page.locator("#timeline")).to_contain_text("done: finished")
        if SCREENSHOT:
            await page.set_viewport_size({"width": 1200, "height": 720})
            await page.screenshot(path=SCREENSHOT)


async def test_the_console_shows_a_retry_and_can_cancel(
    stack: InProcessStack, tmp_path: Path, browser: Browser
) -> None:
    async with serve_gateway(stack.nats_url, stack.prefix, {KEY: "default"}, tmp_path) as url:
        page = await browser.new_page()
        await page.goto(url + "/")
        await page.fill("#key", KEY)
        await page.dispatch_event("#key", "change")
        await page.fill(
            "#input",
            '{"tokens": ["a", "b", "c"], "fail": [{"attempt": 1, "after_tokens": 1, '
            '"kind": "retryable"}]}',
        )
        await page.click("button[type=submit]")
        await expect(page.locator("#run-status")).to_have_text("finished", timeout=30_000)
        await expect(page.locator("#text")).to_have_text("abc")
        timeline = page.locator("#timeline")
        await expect(timeline).to_contain_text("attempt 2 started")
        await expect(timeline).to_contain_text("(retried)")

        await page.fill("#input", '{"tokens": ["x", "y"], "token_delay_ms": 5000}')
        await page.click("button[type=submit]")
        await expect(page.locator("#run-status")).to_have_text("running", timeout=20_000)
        await page.click("#cancel")
        await expect(page.locator("#run-status")).to_have_text("canceled", timeout=20_000)
