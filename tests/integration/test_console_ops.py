"""The console as an operator uses it, in headless Chromium: run history with filters,
pages and live rows, a run opened by its id, a run's tool calls, usage, budget and side
effects, a workflow's node tree with the fallback that handled a failure, Cancel only
where it acts, a phone's width, and text that is HTML shown as text under a strict
Content-Security-Policy. RUNWIRE_SCREENSHOTS=docs writes the screenshots of docs/."""

import os
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, expect

from runwire.contracts.replies import RunSummary
from runwire.contracts.status import RunStatus
from runwire.testing.waiting import eventually
from tests.console_runners import HTML
from tests.gateway import serve_gateway
from tests.services import InProcessStack, collect

pytestmark = [
    pytest.mark.integration,
    pytest.mark.stack(
        runners="hears=tests.waiting:hears,works=tests.console_runners:works,"
        "tricky=tests.console_runners:tricky,spend=tests.runners:spend"
    ),
]

KEY = "rw_test-console-ops"
# A shared, busy machine: give the page time.
expect.set_options(timeout=20_000)
SCREENSHOTS = os.environ.get("RUNWIRE_SCREENSHOTS")
FATAL = [{"attempt": 1, "after_tokens": 0, "kind": "fatal"}]


async def _console(browser: Browser, url: str, width: int = 1280, height: int = 800) -> Page:
    """A fresh page (its own storage, the time zone UTC) on the console, the key given."""
    page = await browser.new_page(viewport={"width": width, "height": height}, timezone_id="UTC")
    await page.goto(url + "/")
    await page.fill("#key", KEY)
    await page.dispatch_event("#key", "change")
    return page


async def _screenshot(page: Page, name: str, *, full_page: bool = False) -> None:
    if SCREENSHOTS:
        await page.screenshot(path=str(Path(SCREENSHOTS) / name), full_page=full_page)


def _between(earlier: datetime, later: datetime) -> str:
    """A time the console's time filter takes (to the millisecond, UTC) after `earlier`
    and no later than `later`."""
    middle = earlier + (later - earlier) / 2
    at = middle.replace(microsecond=middle.microsecond // 1000 * 1000) + timedelta(milliseconds=1)
    assert earlier < at <= later, "runs created less than 2 ms apart"
    return at.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3]


async def _waiting(stack: InProcessStack, run_id: str) -> None:
    async def waits() -> bool:
        return (await stack.client.get(run_id)).status == RunStatus.WAITING

    await eventually(waits, timeout=20)


async def test_history_filters_pages_follows_and_opens_a_run_by_its_id(
    stack: InProcessStack, tmp_path: Path, browser: Browser
) -> None:
    client = stack.client
    done: list[RunSummary] = []
    for i in range(11):
        done.append((await client.submit({"tokens": [f"t{i}"]})).run)
        await collect(client, done[-1].run_id)
    failed = (await client.submit({"tokens": ["x"], "fail": FATAL})).run
    await collect(client, failed.run_id)
    asking = (await client.submit({}, runner="hears")).run
    await _waiting(stack, asking.run_id)
    async with serve_gateway(stack.nats_url, stack.prefix, {KEY: "default"}, tmp_path) as url:
        page = await _console(browser, url)
        rows = page.locator("#runs tr.run")
        await expect(rows).to_have_count(13)
        # Newest first, with its runner and what it waits for.
        await expect(rows.first).to_have_attribute("data-run", asking.run_id)
        await expect(rows.first).to_contain_text("hears")
        await expect(rows.first).to_contain_text('interrupt: {"question":"may I?"}')
        await _screenshot(page, "console-history.png")

        await page.select_option("#f-status", "failed")
        await expect(rows).to_have_count(1)
        await expect(rows.first).to_have_attribute("data-run", failed.run_id)
        await expect(rows.first).to_contain_text("RUNNER_FATAL")
        await page.select_option("#f-status", "")
        await page.fill("#f-runner", "hears")
        await page.click("#f-apply")
        await expect(rows).to_have_count(1)
        await expect(rows.first).to_have_attribute("data-run", asking.run_id)
        # By creation time: from the sixth run on, then before the third.
        await page.fill("#f-runner", "scripted")
        await page.fill("#f-after", _between(done[4].created_at, done[5].created_at))
        await page.click("#f-apply")
        await expect(rows).to_have_count(7)
        await expect(rows.last).to_have_attribute("data-run", done[5].run_id)
        await page.fill("#f-after", "")
        await page.fill("#f-before", _between(done[1].created_at, done[2].created_at))
        await page.click("#f-apply")
        await expect(rows).to_have_count(2)
        await expect(rows.first).to_have_attribute("data-run", done[1].run_id)

        # A page at a time: 10, then the 3 older ones, and back.
        await page.click("#f-clear")
        await page.select_option("#f-limit", "10")
        await expect(rows).to_have_count(10)
        await expect(page.locator("#newer")).to_be_disabled()
        await page.click("#older")
        await expect(rows).to_have_count(3)
        await expect(rows.last).to_have_attribute("data-run", done[0].run_id)
        await expect(page.locator("#older")).to_be_disabled()
        await page.click("#newer")
        await expect(rows).to_have_count(10)
        # A run submitted elsewhere comes to the top of the newest page, live.
        new = (await client.submit({"tokens": ["new"]})).run
        await expect(rows.first).to_have_attribute("data-run", new.run_id)
        await expect(rows.first).to_contain_text("finished")

        # Open by id: pasted, then Enter; something that is no id is said to be none.
        await page.fill("#open-id", "not-a-run")
        await page.press("#open-id", "Enter")
        await expect(page.locator("#open-error")).to_contain_text("a run id looks like")
        await page.fill("#open-id", f"  {done[0].run_id.upper()} ")
        await page.press("#open-id", "Enter")
        await expect(page.locator("#run-id")).to_have_text(done[0].run_id)
        await expect(page.locator("#text")).to_have_text("t0")
        await expect(page.locator("#run-status")).to_have_text("finished")
        assert page.url.endswith(f"#/runs/{done[0].run_id}")
        # Ended: Cancel would change nothing, so it is not offered.
        await expect(page.locator("#cancel")).to_be_disabled()


async def test_a_workflow_run_shows_its_node_tree_and_the_fallback_that_handled_a_failure(
    stack: InProcessStack, tmp_path: Path, browser: Browser
) -> None:
    definition = {
        "nodes": [
            {
                "id": "draft",
                "runner": "scripted",
                "input": {"tokens": ["draft "], "fail": FATAL},
                "on_failure": "fallback",
                "fallback": "cheaper",
            },
            {"id": "cheaper", "runner": "scripted", "input": {"tokens": ["cheap draft "]}},
            {
                "id": "sign",
                "runner": "scripted",
                "input": {"tokens": [{"$ref": "nodes.draft.text"}, "signed"]},
            },
        ],
        "edges": [{"from": "draft", "to": "sign"}],
    }
    await stack.client.release("greet", 1, definition)
    async with serve_gateway(stack.nats_url, stack.prefix, {KEY: "default"}, tmp_path) as url:
        page = await _console(browser, url)
        await expect(page.locator("#page-note")).to_have_text("no runs")
        run_id = (await stack.client.submit_workflow("greet", {})).run.run_id
        rows = page.locator("#runs tr.run")
        await expect(rows.first).to_have_attribute("data-run", run_id)
        await rows.first.click()
        await expect(page.locator("#run-status")).to_have_text("finished", timeout=60_000)
        nodes = page.locator("#nodes")
        # The failed node, handled: under it the fallback that ran in its place.
        draft = nodes.locator('.node[data-node="draft"]')
        await expect(draft).to_have_attribute("data-state", "handled")
        await expect(draft).to_contain_text("failed, handled")
        await expect(draft).to_contain_text("its fallback cheaper ran in its place")
        await expect(nodes.locator('li.slot[data-slot="draft"]')).to_have_attribute(
            "data-state", "completed"
        )
        cheaper = nodes.locator('li.slot[data-slot="draft"] ul.fallbacks .node')
        await expect(cheaper).to_have_attribute("data-node", "cheaper")
        await expect(cheaper).to_contain_text("fallback in place of draft")
        await expect(cheaper).to_have_attribute("data-state", "completed")
        sign = nodes.locator('.node[data-node="sign"]')
        await expect(sign).to_have_attribute("data-state", "completed")
        await expect(nodes.locator(".badge.failed")).to_have_count(0)
        await expect(page.locator("#timeline")).to_contain_text("node draft: fell_back")
        await expect(page.locator("#run-meta")).to_contain_text("greet v1")
        # The history lists the workflow run once, none of its node runs.
        await expect(rows.first).to_contain_text("finished")
        await expect(rows).to_have_count(1)
        await expect(rows.first).to_contain_text("greet v1")
        await _screenshot(page, "console-workflow.png", full_page=True)
        # A node run opens from the tree, and names its workflow run.
        await cheaper.get_by_role("link", name="node run").click()
        await expect(page.locator("#run-id")).not_to_have_text(run_id)  # the node run's page
        await expect(page.locator("#run-status")).to_have_text("finished")
        await expect(page.locator("#text")).to_have_text("cheap draft ")
        await expect(page.locator("#run-meta")).to_contain_text("cheaper of its workflow run")
        await expect(page.locator("#workflow-box")).to_be_hidden()


async def test_a_run_page_shows_tool_calls_usage_and_effects_and_cancels_only_what_runs(
    stack: InProcessStack, tmp_path: Path, browser: Browser
) -> None:
    await stack.allow_effects("noop")
    async with serve_gateway(stack.nats_url, stack.prefix, {KEY: "default"}, tmp_path) as url:
        page = await _console(browser, url)
        await page.fill("#runner", "works")
        await page.fill("#input", "{}")
        await page.click("button[type=submit]")
        await expect(page.locator("#run-status")).to_have_text("finished", timeout=30_000)
        for reloaded in (False, True):  # the page shows it again after a reload
            tool = page.locator('#tools [data-tool="call_1"]')
            await expect(tool).to_contain_text("weather")
            await expect(tool).to_contain_text('{"city":"Oslo"}')
            await expect(tool).to_contain_text('{"sky":"snow","celsius":-3}')
            usage = page.locator("#usage")
            await expect(usage).to_contain_text("2 model calls: 30 tokens in, 12 out, 42 in all")
            await expect(usage).to_contain_text("small-model: 28 tokens")
            await expect(usage).to_contain_text("large-model: 14 tokens")
            effect = page.locator('#effects tr.effect[data-effect="notify"]')
            await expect(effect).to_contain_text("noop")
            await expect(effect.locator(".badge")).to_have_text("committed")
            await expect(effect).to_contain_text("noop-")  # its receipt
            await expect(page.locator("#timeline")).to_contain_text("attempt 1 started")
            await expect(page.locator("#run-result")).to_contain_text('"notified"')
            await expect(page.locator("#text")).to_have_text("Snow in Oslo, -3 °C.")
            await expect(page.locator("#cancel")).to_be_disabled()
            await expect(page.locator("#budget")).to_have_text(
                "no budget of its own, no costly calls"
            )
            if not reloaded:
                await page.click("#frames-box summary")
                await expect(page.locator("#frames tr.frame")).to_have_count(10)
                await expect(page.locator("#frames")).to_contain_text("tool_result")
                await _screenshot(page, "console-run.png", full_page=True)
                await page.reload()
        # A run with a budget that made a costly call: its limits and what it spent.
        spent = await stack.client.submit(
            {"reserve": 60, "use": 40, "reserve_cost": 8, "use_cost": 5, "hold_ms": 0},
            runner="spend",
            budget_tokens=100,
            budget_cost=20,
        )
        await collect(stack.client, spent.run.run_id)
        await page.fill("#open-id", spent.run.run_id)
        await page.press("#open-id", "Enter")
        await expect(page.locator("#run-status")).to_have_text("finished")
        await expect(page.locator("#budget")).to_have_text(
            "1 costly call: 40 of 100 tokens used, 5 of 20 cost units used"
        )
        # A run that runs can be canceled, and then cannot.
        await page.fill("#runner", "scripted")
        await page.fill("#input", '{"tokens": ["a", "b"], "token_delay_ms": 5000}')
        await page.click("button[type=submit]")
        await expect(page.locator("#run-status")).to_have_text("running")
        await expect(page.locator("#cancel")).to_be_enabled()
        await page.click("#cancel")
        await expect(page.locator("#run-status")).to_have_text("canceled")
        await expect(page.locator("#cancel")).to_be_disabled()
        # A run queued behind another of its concurrency key says so.
        await stack.client.set_budget(max_runs_per_key=1)
        slow = {"tokens": ["a"], "token_delay_ms": 5000}
        ahead = await stack.client.submit(slow, concurrency_key="user-7")
        behind = await stack.client.submit(slow, concurrency_key="user-7", priority=3)
        await page.fill("#open-id", behind.run.run_id)
        await page.press("#open-id", "Enter")
        meta = page.locator("#run-meta")
        await expect(meta).to_contain_text("concurrency keyuser-7")
        await expect(meta).to_contain_text("priority3")
        await expect(meta).to_contain_text(
            "waits forits concurrency key: its runs hold the tenant's limit"
        )
        for run in (behind, ahead):
            await stack.client.cancel(run.run.run_id)
        await expect(page.locator("#run-status")).to_have_text("canceled")
        await expect(meta).not_to_contain_text("waits for")


async def test_text_from_a_run_is_shown_as_text_under_a_strict_policy(
    stack: InProcessStack, tmp_path: Path, browser: Browser
) -> None:
    async with serve_gateway(stack.nats_url, stack.prefix, {KEY: "default"}, tmp_path) as url:
        page = await browser.new_page()
        # A key an older console left in localStorage is removed.
        await page.goto(url + "/")
        await page.evaluate("localStorage.setItem('runwire.key', 'rw_left-behind')")
        response = await page.goto(url + "/")
        assert response is not None
        policy = (await response.all_headers())["content-security-policy"]
        assert "script-src 'self'" in policy
        assert "default-src 'none'" in policy
        assert "unsafe" not in policy
        await page.fill("#key", KEY)
        await page.dispatch_event("#key", "change")
        await page.fill("#runner", "tricky")
        await page.fill("#input", "{}")
        await page.click("button[type=submit]")
        await expect(page.locator("#wait-question")).to_have_text(HTML)
        await expect(page.locator("#text")).to_have_text(HTML)
        await expect(page.locator("#tools")).to_contain_text(HTML)
        await expect(page.locator("#timeline")).to_contain_text(HTML)
        await expect(page.locator("#runs tr.run").first.locator(".question")).to_have_text(
            f"interrupt: {HTML}"
        )
        await page.click("#approve")
        await expect(page.locator("#run-status")).to_have_text("failed")
        await expect(page.locator("#run-error")).to_have_text(f"RUNNER_FATAL: refused: {HTML}")
        await expect(page.locator("#runs tr.run").first).to_contain_text("RUNNER_FATAL")
        assert await page.locator("img").count() == 0
        assert await page.evaluate("window.__pwned") is None
        # The key is this tab's, for its session: never in localStorage.
        assert await page.evaluate("sessionStorage.getItem('runwire.key')") == KEY
        assert await page.evaluate("localStorage.length") == 0


async def test_the_console_fits_a_phone(
    stack: InProcessStack, tmp_path: Path, browser: Browser
) -> None:
    await stack.client.release(
        "phone", 1, {"nodes": [{"id": "only", "runner": "scripted", "input": {"tokens": ["x"]}}]}
    )
    workflow = (await stack.client.submit_workflow("phone", {})).run.run_id
    async with serve_gateway(stack.nats_url, stack.prefix, {KEY: "default"}, tmp_path) as url:
        page = await _console(browser, url, width=375, height=740)

        async def fits() -> None:
            width = await page.evaluate("document.documentElement.scrollWidth")
            assert width <= 375, f"the page is {width} px wide on a 375 px screen"
            for box in [await s.bounding_box() for s in await page.locator("section").all()]:
                if box is not None:  # hidden: none
                    assert 0 <= box["x"] <= box["x"] + box["width"] <= 375, box

        # A word longer than the screen is wide, and a waiting run's question.
        await page.fill("#input", '{"tokens": ["' + "x" * 300 + '", " end"]}')
        await page.click("button[type=submit]")
        await expect(page.locator("#run-status")).to_have_text("finished")
        await expect(page.locator("#text")).to_contain_text(" end")
        await fits()
        await page.fill("#runner", "hears")
        await page.fill("#input", "{}")
        await page.click("button[type=submit]")
        await expect(page.locator("#wait-question")).to_be_visible()
        await expect(page.locator("#runs tr.run")).to_have_count(3)
        await fits()
        await _screenshot(page, "console-phone.png")
        # One column: the run's page below the history.
        history = await page.locator("#history").bounding_box()
        run = await page.locator("#run-view").bounding_box()
        assert history is not None
        assert run is not None
        assert run["y"] >= history["y"] + history["height"]
        await page.goto(f"{url}/#/runs/{workflow}")
        await expect(page.locator('#nodes .node[data-node="only"]')).to_have_attribute(
            "data-state", "completed"
        )
        await page.click("#frames-box summary")
        await fits()
