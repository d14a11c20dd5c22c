"""The gateway's LangGraph face measured against the real thing: the same calls of the
official Python `langgraph-sdk` go to LangGraph's own server (the in-memory `langgraph-api`
that `langgraph dev` runs, with tests/reference/chat_graph.py) and to the gateway (with
the runner `chat` of tests/reference/twin.py, which does what the graph does), and what
the client sees must be the same: event names and order, payloads, run and thread
statuses, status codes, ids (each side's ids numbered in the order they appear).

Where runwire differs on purpose, the test says so by name (DELIBERATE below, listed in
docs/langgraph-sdk.md)."""

import asyncio
import json
import re
import shutil
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient

from runwire.testing.waiting import eventually
from tests.gateway import serve_gateway
from tests.nodejs import NODE_DIR, install_node_modules
from tests.reference import same
from tests.services import InProcessStack

pytestmark = [
    pytest.mark.integration,
    pytest.mark.stack(runners="chat=tests.reference.twin:chat", coalesce_text=False),
]

KEY = "rw_test-reference-key"
HELLO = {"messages": [{"role": "user", "content": "hi"}], "reply": ["Hel", "lo"]}
SLOW = {"reply": ["x"] * 40, "delay_ms": 100}
MODES = ["values", "updates", "messages-tuple"]
# The keys of a message's metadata (`messages-tuple`) the gateway reproduces.
METADATA_KEYS = ("graph_id", "assistant_id", "langgraph_node", "thread_id", "run_id")
ID = re.compile(
    r"lc_run--[0-9a-f-]+(-\d+)?|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
    r"|^[0-9a-f]{32}$|^interrupt-\d+$"
)
TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")

Scenario = Callable[[LangGraphClient, httpx.AsyncClient], Awaitable[list[tuple[str, Any]]]]


@pytest.fixture
async def gateway(stack: InProcessStack, tmp_path: Path) -> AsyncIterator[str]:
    async with serve_gateway(stack.nats_url, stack.prefix, {KEY: "default"}, tmp_path) as url:
        yield url


class Names:
    """Each id a side shows, named by the order it first appeared: `<id3>`."""

    def __init__(self) -> None:
        self.seen: dict[str, str] = {}

    def __call__(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {self(k): self(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(self(v) for v in value)
        if isinstance(value, str):
            if TIME.match(value):
                return "<time>"
            return ID.sub(lambda m: self.seen.setdefault(m[0], f"<id{len(self.seen) + 1}>"), value)
        return value


def unnamed(value: Any) -> Any:
    """Named ids as one: for comparing what two different runs show."""
    if isinstance(value, dict):
        return {k: unnamed(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(unnamed(v) for v in value)
    return re.sub(r"<id\d+>", "<id>", value) if isinstance(value, str) else value


def thread_view(thread: dict[str, Any]) -> dict[str, Any]:
    keys = ("thread_id", "status", "values", "metadata", "interrupts", "error")
    return {k: thread.get(k) for k in keys}


def run_view(run: dict[str, Any]) -> dict[str, Any]:
    metadata = {k: v for k, v in run["metadata"].items() if k != "created_by"}
    keys = ("run_id", "thread_id", "assistant_id", "status", "multitask_strategy")
    return {**{k: run[k] for k in keys}, "metadata": metadata}


def event_view(part: Any) -> tuple[str, Any]:
    data = part.data
    if part.event == "messages":
        chunk, metadata = data
        data = [chunk, {k: metadata.get(k) for k in METADATA_KEYS}]
    if part.event == "messages/metadata":
        data = {k: {kk: v["metadata"].get(kk) for kk in METADATA_KEYS} for k, v in data.items()}
    return part.event, data


async def stream(sdk: LangGraphClient, *args: Any, **kwargs: Any) -> list[tuple[str, Any]]:
    return [event_view(part) async for part in sdk.runs.stream(*args, **kwargs)]


async def until_running(sdk: LangGraphClient, thread_id: str, run_id: str) -> None:
    async def running() -> bool:
        return (await sdk.runs.get(thread_id, run_id))["status"] == "running"

    await eventually(running, timeout=15, interval=0.05)


async def both(
    reference: str, gateway: str, scenario: Scenario
) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
    """The scenario's observations on LangGraph's server and on the gateway, ids named."""

    async def on(url: str, key: str | None) -> list[tuple[str, Any]]:
        sdk = get_client(url=url, api_key=key)
        headers = {"x-api-key": key} if key else {}
        try:
            async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as http:
                return Names()(await scenario(sdk, http))  # type: ignore[no-any-return]
        finally:
            await sdk.http.client.aclose()

    theirs, ours = await asyncio.gather(on(reference, None), on(gateway, KEY))
    return theirs, ours


async def test_a_streamed_chat_its_thread_and_a_second_turn(reference: str, gateway: str) -> None:
    async def scenario(sdk: LangGraphClient, http: httpx.AsyncClient) -> list[tuple[str, Any]]:
        seen: list[tuple[str, Any]] = []
        thread = await sdk.threads.create(metadata={"user": "ada"})
        tid = thread["thread_id"]
        seen.append(("created", thread_view(thread)))
        seen.append(("stream", await stream(sdk, tid, "chat", input=HELLO, stream_mode=MODES)))
        seen.append(("thread", thread_view(await sdk.threads.get(tid))))
        state = await sdk.threads.get_state(tid)
        seen.append(("state", {k: state[k] for k in ("values", "next", "tasks", "interrupts")}))
        second = {"messages": [{"role": "user", "content": "again"}], "reply": ["ok"]}
        seen.append(("wait", await sdk.runs.wait(tid, "chat", input=second)))
        runs = await sdk.runs.list(tid)
        seen.append(("runs", [run_view(r) for r in runs]))
        seen.append(("get", run_view(await sdk.runs.get(tid, runs[0]["run_id"]))))
        seen.append(("values", (await sdk.threads.get(tid))["values"]))
        found = await sdk.threads.search(metadata={"user": "ada"}, limit=5)
        seen.append(("search", [thread_view(t) for t in found if t["thread_id"] == tid]))
        return seen

    same(*await both(reference, gateway, scenario))


# Differences kept on purpose: a resumed run goes on from its question, where LangGraph
# starts a new run that runs the interrupted node again from its start.
DELIBERATE_RESUME = "a resume goes on in the same run and repeats no token"


async def test_threads_searched_filtered_sorted_paged_and_selected(
    reference: str, gateway: str
) -> None:
    ids = sorted(str(uuid.uuid4()) for _ in range(3))
    project = f"p-{uuid.uuid4().hex[:8]}"  # this test's threads only

    async def scenario(sdk: LangGraphClient, http: httpx.AsyncClient) -> list[tuple[str, Any]]:
        seen: list[tuple[str, Any]] = []
        for i, tid in enumerate(ids):
            await sdk.threads.create(thread_id=tid, metadata={"project": project, "n": i})
        await sdk.runs.wait(ids[1], "chat", input=HELLO)
        mine = {"project": project}

        async def search(**given: Any) -> list[Any]:
            return await sdk.threads.search(metadata=mine, **given)  # type: ignore[no-any-return]

        seen.append(
            (
                "by id asc",
                [t["thread_id"] for t in await search(sort_by="thread_id", sort_order="asc")],
            )
        )
        seen.append(
            (
                "by id desc, paged",
                [
                    t["thread_id"]
                    for t in await search(sort_by="thread_id", sort_order="desc", limit=2, offset=1)
                ],
            )
        )
        seen.append(
            (
                "ids",
                [t["thread_id"] for t in await search(ids=[ids[2], ids[0]], sort_by="thread_id")],
            )
        )
        seen.append(("status idle", sorted(t["thread_id"] for t in await search(status="idle"))))
        # (`values` is not compared: the in-memory server answers 500 for it once any
        # thread never ran; test_langgraph_sdk.py tests the gateway's.)

        seen.append(
            ("select", await search(ids=[ids[0]], select=["thread_id", "status", "metadata"]))
        )
        return seen

    same(*await both(reference, gateway, scenario))


async def test_an_interrupt_and_its_resume(reference: str, gateway: str) -> None:
    async def scenario(sdk: LangGraphClient, http: httpx.AsyncClient) -> list[tuple[str, Any]]:
        seen: list[tuple[str, Any]] = []
        tid = (await sdk.threads.create())["thread_id"]
        asking = {**HELLO, "ask": {"question": "may I?"}}
        seen.append(("stream", await stream(sdk, tid, "chat", input=asking, stream_mode=MODES)))
        seen.append(("thread", thread_view(await sdk.threads.get(tid))))
        state = await sdk.threads.get_state(tid)
        tasks = [{k: t[k] for k in ("name", "interrupts")} for t in state["tasks"]]
        seen.append(("state", {"next": state["next"], "tasks": tasks}))
        run_id = (await sdk.runs.list(tid))[0]["run_id"]
        seen.append(("run", (await sdk.runs.get(tid, run_id))["status"]))
        seen.append(("join", await sdk.runs.join(tid, run_id)))
        resumed = await stream(sdk, tid, "chat", command={"resume": "yes"}, stream_mode=MODES)
        seen.append(("resumed", resumed))
        seen.append(("thread after", thread_view(await sdk.threads.get(tid))))
        return seen

    theirs, ours = await both(reference, gateway, scenario)
    # DELIBERATE_RESUME: the server streams the node again (its tokens before the
    # question, then the answer, as a new run); the gateway streams the same run on, after
    # the question. Both end with the same values.
    after_theirs, after_ours = theirs.pop(), ours.pop()
    assert unnamed(after_ours) == unnamed(after_theirs)  # the answer's id: the run's
    resumed_theirs, resumed_ours = theirs.pop()[1], ours.pop()[1]
    shape = ["metadata", "values", "messages", "messages", "updates", "values"]
    assert [e for e, _ in resumed_ours] == shape
    assert unnamed(resumed_ours[-2:]) == unnamed(resumed_theirs[-2:])
    assert "".join(d[0]["content"] for e, d in resumed_ours if e == "messages") == " you said yes"
    same(theirs, ours)


async def test_a_failed_run_its_thread_and_wait(reference: str, gateway: str) -> None:
    async def scenario(sdk: LangGraphClient, http: httpx.AsyncClient) -> list[tuple[str, Any]]:
        seen: list[tuple[str, Any]] = []
        tid = (await sdk.threads.create())["thread_id"]
        failing = {**HELLO, "fail": "boom"}
        seen.append(("stream", await stream(sdk, tid, "chat", input=failing, stream_mode=MODES)))
        thread = await sdk.threads.get(tid)
        seen.append(("thread", (thread["status"], thread["values"], sorted(thread["error"]))))
        run = (await sdk.runs.list(tid))[0]
        seen.append(("run", run["status"]))
        waited = await sdk.runs.wait(tid, "chat", input={"fail": "again"}, raise_error=False)
        seen.append(("wait", sorted(waited["__error__"])))
        return seen

    theirs, ours = await both(reference, gateway, scenario)
    # The error event names the error: LangGraph the exception's class and its text,
    # runwire its error code and message (a runner's exception text is never shown).
    for side in (theirs, ours):
        events = side[0][1]
        assert events[-1][0] == "error"
        assert sorted(events[-1][1]) == ["error", "message"]
        events[-1] = ("error", "<error>")
    same(theirs, ours)


async def test_multitask_strategies(reference: str, gateway: str) -> None:
    async def scenario(sdk: LangGraphClient, http: httpx.AsyncClient) -> list[tuple[str, Any]]:
        seen: list[tuple[str, Any]] = []
        for strategy in ("reject", "interrupt", "rollback", "enqueue"):
            tid = (await sdk.threads.create())["thread_id"]
            first = await sdk.runs.create(tid, "chat", input=SLOW)
            await until_running(sdk, tid, first["run_id"])
            second = {"reply": ["second"]}
            response = await http.post(
                f"/threads/{tid}/runs",
                json={"assistant_id": "chat", "input": second, "multitask_strategy": strategy},
            )
            if response.status_code != 200:
                seen.append((strategy, (response.status_code, response.json())))
                await sdk.runs.cancel(tid, first["run_id"], wait=True)
                continue
            values = await sdk.runs.join(tid, response.json()["run_id"])
            got = await http.get(f"/threads/{tid}/runs/{first['run_id']}")
            first_status = got.json()["status"] if got.status_code == 200 else got.status_code
            runs = [r["status"] for r in await sdk.runs.list(tid)]
            thread = await sdk.threads.get(tid)
            seen.append((strategy, (first_status, values, runs, thread["status"])))
        return seen

    same(*await both(reference, gateway, scenario))


async def test_cancel_and_rollback_of_a_background_run(reference: str, gateway: str) -> None:
    async def scenario(sdk: LangGraphClient, http: httpx.AsyncClient) -> list[tuple[str, Any]]:
        seen: list[tuple[str, Any]] = []
        tid = (await sdk.threads.create())["thread_id"]
        run = await sdk.runs.create(tid, "chat", input=SLOW)
        await until_running(sdk, tid, run["run_id"])
        seen.append(("cancel wait", await sdk.runs.cancel(tid, run["run_id"], wait=True)))
        seen.append(("run", (await sdk.runs.get(tid, run["run_id"]))["status"]))
        thread = await sdk.threads.get(tid)
        seen.append(("thread", (thread["status"], thread["error"]["error"])))
        again = await http.post(f"/threads/{tid}/runs/{run['run_id']}/cancel")
        seen.append(("cancel ended", again.status_code))
        run = await sdk.runs.create(tid, "chat", input=SLOW)
        await until_running(sdk, tid, run["run_id"])
        rolled = await http.post(f"/threads/{tid}/runs/{run['run_id']}/cancel?action=rollback")
        seen.append(("rollback", (rolled.status_code, rolled.text)))

        async def gone() -> int:
            answer = await http.get(f"/threads/{tid}/runs/{run['run_id']}")
            return answer.status_code if answer.status_code == 404 else 0

        seen.append(("rolled back", await eventually(gone, timeout=5, interval=0.05)))
        seen.append(("runs", [r["status"] for r in await sdk.runs.list(tid)]))
        return seen

    theirs, ours = await both(reference, gateway, scenario)
    # The server answers a cancel with wait by its thread's values once the run ended:
    # none when the cancel came before its run saved its input, the input when after
    # (seen on a busy machine). The gateway answers the first.
    (_, theirs_cancel), (_, ours_cancel) = theirs.pop(0), ours.pop(0)
    assert theirs_cancel in ({}, {"messages": [], **SLOW}), theirs_cancel
    assert ours_cancel == {}
    same(theirs, ours)


async def test_a_client_that_leaves_a_stream_stops_the_run_when_it_asked_to(
    reference: str, gateway: str
) -> None:
    """`on_disconnect`: "cancel" (what `useStream` sends unless it may reconnect) stops
    the run when its client goes; "continue" (the default) lets it finish."""

    async def scenario(sdk: LangGraphClient, http: httpx.AsyncClient) -> list[tuple[str, Any]]:
        seen: list[tuple[str, Any]] = []
        tid = (await sdk.threads.create())["thread_id"]
        for leaving in ("cancel", "continue", None):
            body: dict[str, Any] = {
                "assistant_id": "chat",
                "input": {**SLOW, "delay_ms": 50},
                "stream_mode": ["messages-tuple"],
            }
            if leaving:
                body["on_disconnect"] = leaving
            async with http.stream("POST", f"/threads/{tid}/runs/stream", json=body) as sent:
                run_id = sent.headers["content-location"].rsplit("/", 1)[-1]
                async for line in sent.aiter_lines():
                    if line.startswith("event: messages"):
                        break  # the first token came: the client goes

            async def ended(run_id: str = run_id) -> str:
                status: str = (await sdk.runs.get(tid, run_id))["status"]
                return status if status not in ("pending", "running") else ""

            seen.append((f"left, on_disconnect={leaving}", await eventually(ended, timeout=20)))
        # Joined with `cancel_on_disconnect`: the joining client's leaving stops it too.
        for cancel in (True, False):
            run = await sdk.runs.create(tid, "chat", input={**SLOW, "delay_ms": 50})
            params = {"cancel_on_disconnect": cancel}
            path = f"/threads/{tid}/runs/{run['run_id']}/stream"
            async with http.stream("GET", path, params=params) as joined:
                async for line in joined.aiter_lines():
                    if line.startswith("event: values"):
                        break

            async def over(run_id: str = run["run_id"]) -> str:
                status: str = (await sdk.runs.get(tid, run_id))["status"]
                return status if status not in ("pending", "running") else ""

            seen.append((f"joined, cancel_on_disconnect={cancel}", await eventually(over, 20)))
        return seen

    same(*await both(reference, gateway, scenario))


async def test_bad_requests_are_answered_as_langgraph_answers(reference: str, gateway: str) -> None:
    async def scenario(sdk: LangGraphClient, http: httpx.AsyncClient) -> list[tuple[str, Any]]:
        seen: list[tuple[str, Any]] = []
        tid = (await sdk.threads.create())["thread_id"]
        unknown = "00000000-0000-0000-0000-000000000000"
        asks: list[tuple[str, str, Any]] = [
            ("unknown graph", "/runs/wait", {"assistant_id": "nope", "input": {}}),
            ("unknown assistant", "/runs/wait", {"assistant_id": unknown, "input": {}}),
            ("stream_mode", f"/threads/{tid}/runs", {"assistant_id": "chat", "stream_mode": "x"}),
            (
                "multitask",
                f"/threads/{tid}/runs",
                {"assistant_id": "chat", "multitask_strategy": "x"},
            ),
            ("if_not_exists", f"/threads/{tid}/runs", {"assistant_id": "chat", "if_not_exists": 1}),
            ("no assistant", f"/threads/{tid}/runs", {"input": {}}),
            ("unknown thread", f"/threads/{unknown}/runs", {"assistant_id": "chat"}),
            ("not json", f"/threads/{tid}/runs", None),
            ("search limit", "/threads/search", {"limit": "many"}),
            ("search offset", "/threads/search", {"offset": -1}),
            ("search status", "/threads/search", {"status": "sleeping"}),
            ("search metadata", "/threads/search", {"metadata": [1]}),
        ]
        for label, path, body in asks:
            if body is None:
                response = await http.post(path, content=b"{nope")
            else:
                response = await http.post(path, json=body)
            answer = response.json()
            seen.append((label, (response.status_code, sorted(answer) if answer else answer)))
            if label in ("unknown graph", "unknown assistant", "unknown thread", "not json"):
                # The registered graphs are runwire's runners: its built-in ones too.
                said = response.json()["detail"].replace(", effect, openai, scripted, signal", "")
                seen.append((label + " says", said))
        for query in ("limit=abc", "offset=x", "limit=1e9", "status=x", "limit=-1", "offset=-1"):
            listed = await http.get(f"/threads/{tid}/runs?{query}")
            seen.append((f"runs {query}", (listed.status_code, sorted(listed.json()))))
        for search in ({"limit": "x"}, {"offset": -1}, {"graph_id": 5}, {"sort_by": "x"}):
            found = await http.post("/assistants/search", json=search)
            seen.append((f"assistants {search}", found.status_code))
        missing = await http.get(f"/threads/{unknown}")
        seen.append(("get unknown thread", (missing.status_code, missing.json())))
        missing = await http.get(f"/threads/{tid}/runs/{unknown}")
        seen.append(("get unknown run", missing.status_code))
        missing = await http.post(f"/threads/{tid}/runs/{unknown}/cancel")
        seen.append(("cancel unknown run", missing.status_code))
        return seen

    same(*await both(reference, gateway, scenario))


async def test_a_background_run_joined_and_the_messages_mode(reference: str, gateway: str) -> None:
    async def scenario(sdk: LangGraphClient, http: httpx.AsyncClient) -> list[tuple[str, Any]]:
        seen: list[tuple[str, Any]] = []
        tid = (await sdk.threads.create())["thread_id"]
        seen.append(
            ("messages", await stream(sdk, tid, "chat", input=HELLO, stream_mode="messages"))
        )
        run = await sdk.runs.create(
            tid, "chat", input={"reply": ["x", "y"], "delay_ms": 50}, stream_mode=MODES
        )
        seen.append(("created", run_view(run)))
        seen.append(
            ("joined", [event_view(p) async for p in sdk.runs.join_stream(tid, run["run_id"])])
        )
        # runwire's built-in runners are assistants too: only `chat` is compared.
        found = await sdk.assistants.search(graph_id="chat")
        seen.append(("assistants", [(a["assistant_id"], a["graph_id"], a["name"]) for a in found]))
        got = await sdk.assistants.get(found[0]["assistant_id"])
        seen.append(("assistant", (got["assistant_id"], got["graph_id"])))
        return seen

    same(*await both(reference, gateway, scenario))


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
async def test_the_javascript_client_sees_the_same(reference: str, gateway: str) -> None:
    """The official JavaScript client (@langchain/langgraph-sdk), the same calls on both
    servers (tests/node/langgraph_reference.mjs)."""
    await asyncio.to_thread(install_node_modules)

    async def run(url: str, key: str) -> list[tuple[str, Any]]:
        node = await asyncio.create_subprocess_exec(
            "node",
            "langgraph_reference.mjs",
            url,
            key,
            cwd=NODE_DIR,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(node.communicate(), 120)
        assert node.returncode == 0, err.decode()
        return Names()([tuple(pair) for pair in json.loads(out)])  # type: ignore[no-any-return]

    theirs, ours = await asyncio.gather(run(reference, ""), run(gateway, KEY))
    same(theirs, ours)


async def test_the_events_mode_is_a_subset_of_the_servers(reference: str, gateway: str) -> None:
    """`events`: runwire sends the graph's start and end, the model's deltas and its end
    (not the node's own chain events, nor the model's start), each as the server does."""

    async def scenario(sdk: LangGraphClient, http: httpx.AsyncClient) -> list[tuple[str, Any]]:
        tid = (await sdk.threads.create())["thread_id"]
        parts = [p async for p in sdk.runs.stream(tid, "chat", input=HELLO, stream_mode="events")]
        kinds = [(p.data["event"], p.data["data"]) for p in parts if p.event == "events"]
        return [("events", kinds)]

    theirs, ours = await both(reference, gateway, scenario)
    mine = ours[0][1]
    assert [k for k, _ in mine] == [
        "on_chain_start",
        *["on_chat_model_stream"] * 3,
        "on_chat_model_end",
        "on_chain_end",
    ]
    # Each of runwire's events is one of the server's, in the same order, with its data
    # (the server's may say more: the model's end its input too).
    rest = iter(theirs[0][1])
    for kind, data in mine:
        assert any(
            k == kind and all(unnamed(d.get(key)) == unnamed(v) for key, v in data.items())
            for k, d in rest
        ), (kind, data)
