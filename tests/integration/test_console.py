"""The web console in headless Chromium (Debian's, driven by Playwright): submit a run,
watch its text stream, reload the page mid-stream, and find the final text exact; see a
waiting run's question, answer it (approve, reject, typed, a signal) and watch the run
go on to its end."""

import os
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, expect

from runwire.contracts.status import RunStatus
from runwire.testing.waiting import eventually
from tests.gateway import serve_gateway
from tests.services import InProcessStack, collect

pytestmark = pytest.mark.integration

KEY = "rw_test-console-key"
# A shared, busy machine: give the page time.
expect.set_options(timeout=20_000)
# Where the gateway page's screenshot comes from (RUNWIRE_SCREENSHOT=path to write one).
SCREENSHOT = os.environ.get("RUNWIRE_SCREENSHOT")


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


WAITING = pytest.mark.stack(
    runners="hears=tests.waiting:hears,collects=tests.waiting:collects",
    recovery_interval_ms=100,
)
QUESTION = '{"question":"may I?"}'  # `hears`'s question, as the console shows it


async def _console(browser: Browser, url: str, *, cut_live: bool = False) -> Page:
    """A fresh browser page (its own storage) on the console, with the API key given.
    `cut_live`: its event streams never connect (a network that drops them), so it
    learns of a run's changes only from `get`."""
    page = await browser.new_page()
    if cut_live:
        await page.route("**/frames", lambda route: route.abort())
        await page.route("**/v1/events", lambda route: route.abort())
    await page.goto(url + "/")
    await page.fill("#key", KEY)
    await page.dispatch_event("#key", "change")
    return page


async def _submit(page: Page, runner: str) -> None:
    await page.fill("#runner", runner)
    await page.fill("#input", "{}")
    await page.click("button[type=submit]")


async def _asks(page: Page, question: str = QUESTION) -> None:
    """The page shows a question (of the run it shows: the panel is not hidden)."""
    await expect(page.locator("#wait")).to_be_visible()
    await expect(page.locator("#wait-question")).to_have_text(question)


async def _finished_with(page: Page, text: str) -> None:
    """The page shows the run finished, its text exactly `text` (nothing shown twice),
    and no question."""
    await expect(page.locator("#run-status")).to_have_text("finished", timeout=30_000)
    await expect(page.locator("#timeline")).to_contain_text("done: finished")
    await expect(page.locator("#text")).to_have_text(text)
    assert await page.locator("#text").inner_text() == text
    await expect(page.locator("#wait")).to_be_hidden()


async def _waiting(stack: InProcessStack, run_id: str) -> None:
    async def waits() -> bool:
        return (await stack.client.get(run_id)).status == RunStatus.WAITING

    await eventually(waits, timeout=20)


@WAITING
async def test_the_console_shows_a_question_after_a_reload_and_approves_it(
    stack: InProcessStack, tmp_path: Path, browser: Browser
) -> None:
    async with serve_gateway(stack.nats_url, stack.prefix, {KEY: "default"}, tmp_path) as url:
        page = await _console(browser, url)
        await _submit(page, "hears")
        await _asks(page)
        await expect(page.locator("#wait-kind")).to_contain_text("an answer (interrupt)")
        await expect(page.locator("#run-status")).to_have_text("waiting")
        await expect(page.locator("#runs tr.run").first).to_contain_text(f"interrupt: {QUESTION}")
        await expect(page.locator("#timeline")).to_contain_text("waits for an answer")
        # Reloaded, the page finds the question again, and the text so far once.
        await page.reload()
        await _asks(page)
        await expect(page.locator("#text")).to_have_text("hello")
        run_id = page.url.rsplit("/", 1)[1]
        # So does a page that opens the run later (nothing of it in its storage), and
        # its list of runs shows the question (the runs waiting now).
        later = await _console(browser, url)
        await expect(later.locator("#runs tr.run").first).to_contain_text(QUESTION)
        await later.goto(f"{url}/#/runs/{run_id}")
        await _asks(later)
        await expect(later.locator("#text")).to_have_text("hello")

        await later.click("#approve")
        await _finished_with(later, 'hello got {"approved": true}')
        await _finished_with(page, 'hello got {"approved": true}')  # the other page too
        await expect(page.locator("#runs tr.run").first).not_to_contain_text(QUESTION)


@WAITING
async def test_the_console_rejects_with_a_reason_and_answers_with_text(
    stack: InProcessStack, tmp_path: Path, browser: Browser
) -> None:
    async with serve_gateway(stack.nats_url, stack.prefix, {KEY: "default"}, tmp_path) as url:
        page = await _console(browser, url)
        await _submit(page, "hears")
        await _asks(page)
        await page.fill("#reject-reason", "not now")
        await page.click("#reject")
        await _finished_with(page, 'hello got {"approved": false, "reason": "not now"}')

        # Typed text that is not JSON is sent as a string; JSON as what it says.
        for typed, said in (("sure thing", '"sure thing"'), ('{"say": [1, 2]}', '{"say": [1, 2]}')):
            await _submit(page, "hears")
            await _asks(page)
            await page.fill("#answer", typed)
            await page.click("#answer-send")
            await _finished_with(page, f"hello got {said}")


@WAITING
async def test_the_console_answers_a_text_question_and_sends_signals(
    stack: InProcessStack, tmp_path: Path, browser: Browser
) -> None:
    async with serve_gateway(stack.nats_url, stack.prefix, {KEY: "default"}, tmp_path) as url:
        page = await _console(browser, url)
        await _submit(page, "collects")
        await _asks(page, "ready?")  # text as text
        await page.fill("#answer", "go")
        await page.click("#answer-send")
        for amount in (3, 4):
            # The next wait: its buttons are enabled (they were not, once sent).
            await expect(page.locator("#signal-send")).to_be_enabled()
            await expect(page.locator("#wait-kind")).to_contain_text("the signal paid (signal)")
            await expect(page.locator("#wait-interrupt")).to_be_hidden()
            await page.fill("#signal-payload", f'{{"amount": {amount}}}')
            await page.click("#signal-send")
        await _finished_with(page, "paid 3 then 4")
        await expect(page.locator("#wait-note")).to_have_text("Signal sent: the run goes on.")


@WAITING
async def test_the_console_says_so_when_someone_else_answered_first(
    stack: InProcessStack, tmp_path: Path, browser: Browser
) -> None:
    run_id = (await stack.client.submit({}, runner="hears")).run.run_id
    await _waiting(stack, run_id)
    async with serve_gateway(stack.nats_url, stack.prefix, {KEY: "default"}, tmp_path) as url:
        # A page that hears nothing live shows the question from `get` ...
        page = await _console(browser, url, cut_live=True)
        await page.goto(f"{url}/#/runs/{run_id}")
        await _asks(page)
        # ... while someone else answers, and the run goes on to its end.
        await stack.client.resume(run_id, {"say": "first"})
        _, transcript = await collect(stack.client, run_id)
        assert transcript.text == 'hello got {"say": "first"}'
        await page.click("#approve")
        error = page.locator("#wait-error")
        await expect(error).to_contain_text("NOT_WAITING")
        await expect(error).to_contain_text("answered already")
        await expect(page.locator("#run-status")).to_have_text("finished")
        await expect(page.locator("#wait")).to_be_hidden()
        await expect(error).to_contain_text("NOT_WAITING")  # still there to read
