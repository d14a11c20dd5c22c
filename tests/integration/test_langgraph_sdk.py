"""The official `langgraph-sdk` Python client, unchanged, against the gateway: threads,
streamed runs, a stream joined again after a disconnect, wait, cancel, reject and
enqueue."""

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.errors import ConflictError

from tests.gateway import serve_gateway
from tests.services import InProcessStack, collect

pytestmark = pytest.mark.integration

KEY = "rw_test-langgraph-key"
TOKENS = ["Hello", ", ", "thread", "!"]


@pytest.fixture
async def sdk(stack: InProcessStack, tmp_path: Path) -> AsyncIterator[LangGraphClient]:
    async with serve_gateway(
        stack.nats_url, stack.prefix, {KEY: "default"}, tmp_path, gateway_heartbeat_s=1
    ) as url:
        client = get_client(url=url, api_key=KEY)
        try:
            yield client
        finally:
            await client.http.client.aclose()


def _texts(parts: list[Any], event: str = "messages") -> list[str]:
    return [p.data[0]["content"] for p in parts if p.event == event]


@pytest.mark.stack(coalesce_text=False)  # one frame per delta, as the test counts them
async def test_a_streamed_answer_arrives_as_message_chunks_then_the_final_values(
    sdk: LangGraphClient,
) -> None:
    thread = await sdk.threads.create(metadata={"user": "ada"})
    assert thread["status"] == "idle"
    created: list[Any] = []
    parts = [
        part
        async for part in sdk.runs.stream(
            thread["thread_id"],
            "scripted",
            input={"tokens": TOKENS},
            stream_mode=["messages-tuple", "values", "updates"],
            on_run_created=created.append,
        )
    ]
    assert parts[0].event == "metadata"
    run_id = parts[0].data["run_id"]
    assert created[0]["run_id"] == run_id
    assert created[0]["thread_id"] == thread["thread_id"]
    # Each token a chunk of one AI message, then the closing empty chunk.
    assert _texts(parts) == [*TOKENS, ""]
    values = [p.data for p in parts if p.event == "values"]
    assert values[0] == {"tokens": TOKENS, "messages": []}
    answer = values[-1]["messages"][-1]
    assert (answer["type"], answer["content"]) == ("ai", "".join(TOKENS))
    assert [p.data for p in parts if p.event == "updates"] == [{"scripted": {"messages": [answer]}}]
    assert parts[-1].event == "values"
    run = await sdk.runs.get(thread["thread_id"], run_id)
    assert run["status"] == "success"
    again = await sdk.threads.get(thread["thread_id"])
    assert again["metadata"]["user"] == "ada"
    assert again["values"] == values[-1]


async def test_join_stream_after_a_disconnect_misses_and_repeats_nothing(
    sdk: LangGraphClient,
) -> None:
    tokens = [f"t{i} " for i in range(30)]
    thread = await sdk.threads.create()
    first: list[Any] = []
    stream = sdk.runs.stream(
        thread["thread_id"],
        "scripted",
        input={"tokens": tokens, "token_delay_ms": 20},
        stream_mode="messages-tuple",
        stream_resumable=True,
    )
    async for part in stream:
        first.append(part)
        if len(_texts(first)) == 7:
            break  # the client goes away mid-answer
    await stream.aclose()
    run_id = first[0].data["run_id"]
    last_id = [p.id for p in first if p.id is not None][-1]
    rest = [
        part
        async for part in sdk.runs.join_stream(
            thread["thread_id"], run_id, last_event_id=last_id, stream_mode="messages-tuple"
        )
    ]
    # Deltas emitted while the frame before was on its way join it (a slow machine): the
    # text is compared, not how it was cut into frames.
    assert "".join(_texts(first) + _texts(rest)) == "".join(tokens)


async def test_wait_returns_the_final_values_or_the_error(sdk: LangGraphClient) -> None:
    values = await sdk.runs.wait(None, "scripted", input={"tokens": ["done"]})
    assert [m["content"] for m in values["messages"]] == ["done"]
    thread = await sdk.threads.create()
    failing = {"tokens": ["x"], "fail": [{"attempt": 1, "after_tokens": 0, "kind": "fatal"}]}
    answer = await sdk.runs.wait(thread["thread_id"], "scripted", input=failing, raise_error=False)
    assert answer["__error__"]["error"] == "RUNNER_FATAL"
    with pytest.raises(Exception, match="RUNNER_FATAL"):
        await sdk.runs.wait(thread["thread_id"], "scripted", input=failing)


async def test_cancel_stops_a_run_and_reject_is_a_conflict(sdk: LangGraphClient) -> None:
    thread = await sdk.threads.create()
    tid = thread["thread_id"]
    run = await sdk.runs.create(
        tid, "scripted", input={"tokens": ["x"] * 500, "token_delay_ms": 20}
    )
    busy = await sdk.threads.get(tid)
    assert busy["status"] == "busy"
    with pytest.raises(ConflictError):
        await sdk.runs.create(tid, "scripted", input={"tokens": ["y"]}, multitask_strategy="reject")
    assert await sdk.runs.cancel(tid, run["run_id"], wait=True) == {}
    assert (await sdk.runs.get(tid, run["run_id"]))["status"] == "interrupted"
    # An ended run is not canceled again: 404, as LangGraph's server answers.
    with pytest.raises(httpx.HTTPStatusError) as ended:
        await sdk.runs.cancel(tid, run["run_id"])
    assert ended.value.response.status_code == 404


async def test_a_threads_enqueued_runs_run_in_order(sdk: LangGraphClient) -> None:
    thread = await sdk.threads.create()
    tid = thread["thread_id"]
    runs = [
        await sdk.runs.create(
            tid,
            "scripted",
            input={"tokens": [f"run{i}"], "token_delay_ms": 30},
            multitask_strategy="enqueue",
        )
        for i in range(3)
    ]
    results = [await sdk.runs.join(tid, r["run_id"]) for r in runs]
    # Each run's answer is added to the thread's messages, in the order of the runs.
    assert [m["content"] for m in results[-1]["messages"]] == ["run0", "run1", "run2"]
    assert [r["messages"][-1]["content"] for r in results] == ["run0", "run1", "run2"]


async def test_unknown_threads_and_missing_keys_are_refused(
    sdk: LangGraphClient, stack: InProcessStack
) -> None:
    with pytest.raises(httpx.HTTPStatusError) as missing:
        await sdk.threads.get("no-such-thread")
    assert missing.value.response.status_code == 404
    with pytest.raises(httpx.HTTPStatusError) as no_thread:
        await sdk.runs.create("nowhere", "scripted", input={"tokens": ["x"]})
    assert no_thread.value.response.status_code == 404
    made = await sdk.runs.create(
        "made-here", "scripted", input={"tokens": ["x"]}, if_not_exists="create"
    )
    assert made["thread_id"] == "made-here"
    stranger = get_client(url=str(sdk.http.client.base_url), api_key="rw_wrong")
    try:
        with pytest.raises(httpx.HTTPStatusError) as refused:
            await stranger.threads.create()
        assert refused.value.response.status_code == 401
    finally:
        await stranger.http.client.aclose()


@pytest.mark.stack(runners="asks=tests.waiting:asks")
async def test_an_interrupt_stops_the_stream_and_a_resume_command_goes_on(
    sdk: LangGraphClient,
) -> None:
    """As LangGraph's own server shows an `interrupt()`: `__interrupt__` in the last
    `updates` and `values`, the run `success`, the thread `interrupted` with the question;
    `command={"resume": ...}` answers it and the thread's text goes on, repeating nothing."""
    thread = await sdk.threads.create()
    tid = thread["thread_id"]
    modes = ["values", "updates"]
    parts = [part async for part in sdk.runs.stream(tid, "asks", input={}, stream_mode=modes)]
    run_id = parts[0].data["run_id"]
    question = [{"value": {"question": "may I?"}, "id": "interrupt-1"}]
    asked = [{**question[0], "response_schema": None}]
    assert parts[-2].event == "updates"
    assert parts[-2].data == {"__interrupt__": asked}
    assert parts[-1].event == "values"
    assert parts[-1].data == {"messages": [], "__interrupt__": asked}
    assert (await sdk.runs.get(tid, run_id))["status"] == "success"
    interrupted = await sdk.threads.get(tid)
    assert interrupted["status"] == "interrupted"
    assert list(interrupted["interrupts"].values()) == [question]
    # `runs.join` of it answers the question.
    assert await sdk.runs.join(tid, run_id) == {"__interrupt__": question}

    resumed = [
        part
        async for part in sdk.runs.stream(
            tid, "asks", command={"resume": {"say": "yes"}}, stream_mode=modes
        )
    ]
    assert resumed[0].event == "metadata"
    assert resumed[0].data["run_id"] == run_id  # the run goes on (LangGraph: a new run)
    values = [p.data for p in resumed if p.event == "values"]
    assert [m["content"] for m in values[-1]["messages"]] == ["hello you said yes"]
    assert [p.event for p in resumed][-1] == "values"
    done = await sdk.threads.get(tid)
    assert (done["status"], done["interrupts"]) == ("idle", {})
    # Nothing to resume now: refused, not a run without input.
    with pytest.raises(ConflictError):
        await sdk.runs.create(tid, "asks", command={"resume": "again"})


@pytest.mark.stack(runners="asks=tests.waiting:asks")
async def test_wait_answers_an_interrupt_then_its_resume(sdk: LangGraphClient) -> None:
    thread = await sdk.threads.create()
    tid = thread["thread_id"]
    asked = await sdk.runs.wait(tid, "asks", input={})
    assert asked["__interrupt__"][0]["value"] == {"question": "may I?"}
    answered = await sdk.runs.wait(tid, "asks", command={"resume": {"say": "no"}})
    assert answered["messages"][-1]["content"] == "hello you said no"


async def test_a_run_of_the_threads_session_submitted_through_runwire_shows_its_runner(
    sdk: LangGraphClient, stack: InProcessStack
) -> None:
    """A thread is a session: a run submitted to that session with runwire's own client
    is one of the thread's runs, its assistant the runner it ran."""
    tid = (await sdk.threads.create())["thread_id"]
    reply = await stack.client.submit({"tokens": ["x"]}, runner="scripted", session_id=tid)
    await collect(stack.client, reply.run.run_id)
    runs = await sdk.runs.list(tid)
    assert [(r["run_id"], r["status"]) for r in runs] == [(reply.run.run_id, "success")]
    scripted = await sdk.assistants.search(graph_id="scripted")
    assert runs[0]["assistant_id"] == scripted[0]["assistant_id"]


async def test_threads_searched_by_their_values(sdk: LangGraphClient) -> None:
    """`values` in a search: the threads whose values hold each key as given."""
    ran, idle = (await sdk.threads.create())["thread_id"], (await sdk.threads.create())["thread_id"]
    await sdk.runs.wait(ran, "scripted", input={"tokens": ["tides"]})
    found = await sdk.threads.search(values={"tokens": ["tides"]})
    assert [t["thread_id"] for t in found] == [ran]
    assert {ran, idle} <= {t["thread_id"] for t in await sdk.threads.search(limit=50)}


async def test_no_bad_request_to_the_langgraph_api_is_a_server_error(
    sdk: LangGraphClient,
) -> None:
    """Junk in every query parameter and body the LangGraph routes read is answered 4xx
    with a `detail`, never 500."""
    http = sdk.http.client
    tid = (await sdk.threads.create())["thread_id"]
    await sdk.runs.wait(tid, "scripted", input={"tokens": ["a"]})
    rid = (await sdk.runs.list(tid))[0]["run_id"]
    asks: list[tuple[str, str, Any]] = []
    for junk in ("abc", "-1", "1e99", "", "[]"):
        for path in (
            f"/threads/{tid}/runs?limit={junk}",
            f"/threads/{tid}/runs?offset={junk}",
            f"/threads/{tid}/runs?status={junk}",
            f"/threads/{tid}/history?limit={junk}",
            f"/assistants/{junk or 'x'}",
            f"/assistants/{junk or 'x'}/graph",
            f"/threads/{junk or 'x'}",
            f"/threads/{tid}/runs/{junk or 'x'}",
        ):
            asks.append(("GET", path, None))
        asks.append(("POST", f"/threads/{tid}/runs/{rid}/cancel?wait={junk}", None))
        asks.append(("POST", f"/threads/{tid}/runs/{rid}/cancel?action={junk}", None))
    bodies: list[Any] = [{"limit": "x"}, {"limit": -5}, {"offset": "x"}, [], "x", {"metadata": "x"}]
    bodies += [{"graph_id": 5}, {"status": 5}, {"ids": "x"}, {"sort_by": 1}, {"select": ["x"]}]
    for body in bodies:
        for method, path in (
            ("POST", "/assistants/search"),
            ("POST", f"/threads/{tid}/history"),
            ("POST", "/threads"),
            ("PATCH", f"/threads/{tid}"),
            ("POST", "/threads/search"),
            ("POST", f"/threads/{tid}/runs"),
            ("POST", "/runs/wait"),
        ):
            asks.append((method, path, body))
    answers = []
    for method, path, body in asks:
        answer = await http.request(method, path, json=body)
        answers.append((method, path, body, answer.status_code))
        if answer.status_code >= 400:
            assert "detail" in answer.json(), (method, path, body, answer.text)
    assert [a for a in answers if a[3] >= 500] == []
    assert sum(a[3] >= 400 for a in answers) > len(answers) // 2  # junk is mostly refused
