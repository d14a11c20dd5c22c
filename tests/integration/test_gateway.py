"""The gateway's own API over real HTTP (uvicorn), against the four services: one
endpoint per command, a run's frames as Server-Sent Events that resume by
`Last-Event-ID`, API keys per tenant, the wire's errors with fitting statuses."""

import asyncio
import json
import random
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from runwire.contracts.frames import Frame, FrameType, Transcript
from runwire.testing.waiting import eventually, pace
from tests.gateway import serve_gateway, sse_frames
from tests.services import InProcessStack, assert_well_formed

pytestmark = pytest.mark.integration

KEY = "rw_test-default-key"
OTHER_KEY = "rw_test-acme-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture
async def http(stack: InProcessStack, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        serve_gateway(
            stack.nats_url,
            stack.prefix,
            {KEY: "default", OTHER_KEY: "acme"},
            tmp_path,
            gateway_heartbeat_s=0.3,
            gateway_max_body_bytes=4096,
            # A thousand readers of one run, under one key.
            gateway_max_requests_per_key=2000,
        ) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        yield client


async def _submit(http: httpx.AsyncClient, body: dict, **headers: str) -> httpx.Response:  # type: ignore[type-arg]
    return await http.post(
        "/v1/runs", json={"request_id": str(random.random()), **body}, headers={**AUTH, **headers}
    )


async def _frames(
    http: httpx.AsyncClient, run_id: str, *, after: int | None = None, limit: int | None = None
) -> list[Frame]:
    headers = dict(AUTH)
    if after is not None:
        headers["Last-Event-ID"] = str(after)
    frames: list[Frame] = []
    async with http.stream("GET", f"/v1/runs/{run_id}/frames", headers=headers) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        async for event_id, frame in sse_frames(response, limit):
            assert event_id == str(frame.seq)
            frames.append(frame)
    return frames


@pytest.mark.stack(coalesce_text=False)  # one frame per delta, as the test counts them
async def test_a_run_submitted_over_http_streams_as_server_sent_events(
    http: httpx.AsyncClient,
) -> None:
    submitted = await _submit(http, {"input": {"tokens": ["Hello", ", ", "web"]}})
    assert submitted.status_code == 201
    run = submitted.json()["run"]
    assert submitted.headers["location"] == f"/v1/runs/{run['run_id']}"

    frames = await _frames(http, run["run_id"])
    assert_well_formed(frames)
    assert [f.data["text"] for f in frames if f.type == FrameType.MESSAGE] == ["Hello", ", ", "web"]
    assert frames[-1].data == {"status": "finished"}

    got = await http.get(f"/v1/runs/{run['run_id']}", headers=AUTH)
    assert got.status_code == 200
    assert got.json()["run"]["status"] == "finished"
    again = await http.post(
        "/v1/runs", json={"request_id": run["request_id"], "input": {"tokens": ["x"]}}, headers=AUTH
    )
    assert again.status_code == 200
    assert again.json()["duplicate"] is True


async def test_a_client_that_leaves_and_comes_back_by_last_event_id_misses_and_repeats_nothing(
    http: httpx.AsyncClient,
) -> None:
    tokens = [f"t{i} " for i in range(40)]
    script = {
        "tokens": tokens,
        "token_delay_ms": 10,
        "fail": [{"attempt": 1, "after_tokens": 12, "kind": "retryable"}],
    }
    run_id = (await _submit(http, {"input": script})).json()["run"]["run_id"]
    rng = random.Random(7)
    frames: list[Frame] = []
    while not frames or frames[-1].type != FrameType.DONE:
        # Leave after a few events, then come back from the last one seen.
        piece = await _frames(
            http, run_id, after=frames[-1].seq if frames else None, limit=rng.randint(1, 9)
        )
        frames.extend(piece)
    assert_well_formed(frames)
    assert [f.seq for f in frames] == list(range(1, len(frames) + 1))
    transcript = Transcript()
    for frame in frames:
        transcript.apply(frame)
    assert transcript.text == "".join(tokens)
    assert [f.data["attempt"] for f in frames if f.type == FrameType.RUN] == [1, 2]
    # `?after=` is the same cursor for clients that cannot set headers.
    async with http.stream(
        "GET", f"/v1/runs/{run_id}/frames", params={"after": len(frames) - 1}, headers=AUTH
    ) as response:
        tail = [frame async for _, frame in sse_frames(response)]
    assert [f.seq for f in tail] == [len(frames)]


async def test_an_idle_stream_carries_comment_heartbeats(http: httpx.AsyncClient) -> None:
    run_id = (await _submit(http, {"input": {"tokens": ["a", "b"], "token_delay_ms": 800}})).json()[
        "run"
    ]["run_id"]
    comments = 0
    async with http.stream("GET", f"/v1/runs/{run_id}/frames", headers=AUTH) as response:
        async for line in response.aiter_lines():
            if line.startswith(": keep-alive"):
                comments += 1
            if line.startswith("event: done"):
                break
    assert comments >= 2


async def test_keys_name_the_tenant_and_nothing_happens_without_one(
    http: httpx.AsyncClient, stack: InProcessStack
) -> None:
    before = len(await stack.store.timeline())
    for headers in ({}, {"Authorization": "Bearer nope"}, {"x-api-key": "nope"}):
        refused = await http.post(
            "/v1/runs", json={"request_id": "x", "input": {"tokens": ["x"]}}, headers=headers
        )
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "UNAUTHORIZED"
        assert refused.json()["error"]["retryable"] is False
    assert len(await stack.store.timeline()) == before  # nothing was submitted

    run_id = (await _submit(http, {"input": {"tokens": ["mine"]}})).json()["run"]["run_id"]
    other = {"x-api-key": OTHER_KEY}
    for call in (
        http.get(f"/v1/runs/{run_id}", headers=other),
        http.post(f"/v1/runs/{run_id}/cancel", headers=other),
        http.get(f"/v1/runs/{run_id}/frames", headers=other),
    ):
        response = await call
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "NOT_FOUND"
    # The other tenant's own run is its own.
    theirs = await http.post(
        "/v1/runs", json={"request_id": "a", "input": {"tokens": ["x"]}}, headers=other
    )
    assert theirs.status_code == 201
    assert theirs.json()["run"]["tenant"] == "acme"


async def test_errors_are_the_wires_with_fitting_statuses(http: httpx.AsyncClient) -> None:
    cases = [
        (await http.post("/v1/runs", content=b"{not json", headers=AUTH), 400, "INVALID_REQUEST"),
        (await _submit(http, {"input": {"tokens": "x"}}), 400, "INVALID_REQUEST"),
        (await _submit(http, {"input": {"tokens": ["x" * 5000]}}), 413, "PAYLOAD_TOO_LARGE"),
        (await http.get("/v1/runs/no-such-run", headers=AUTH), 404, "NOT_FOUND"),
        (
            await http.get("/v1/runs/x/frames", headers={**AUTH, "Last-Event-ID": "-3"}),
            400,
            "INVALID_REQUEST",
        ),
    ]
    busy = {"input": {"tokens": ["x"] * 50, "token_delay_ms": 50}, "session_id": "s1"}
    assert (await _submit(http, busy)).status_code == 201
    cases.append((await _submit(http, {**busy, "multitask": "reject"}), 409, "SESSION_BUSY"))
    for response, status, code in cases:
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert error["code"] == code
        assert error["retryable"] is False
        assert error["message"]


async def test_cancel_and_abort_session(http: httpx.AsyncClient) -> None:
    slow = {"input": {"tokens": ["x"] * 200, "token_delay_ms": 20}}
    run_id = (await _submit(http, slow)).json()["run"]["run_id"]
    await _frames(http, run_id, limit=3)  # it runs
    canceled = await http.post(f"/v1/runs/{run_id}/cancel", headers=AUTH)
    assert canceled.status_code == 200
    frames = await _frames(http, run_id)
    assert frames[-1].data == {"status": "canceled", "code": "CANCELED"}

    in_session = (await _submit(http, {**slow, "session_id": "chat"})).json()["run"]["run_id"]
    aborted = await http.post("/v1/sessions/chat/abort", headers=AUTH)
    assert aborted.status_code == 200
    assert aborted.json()["canceled"] == [in_session]

    async def ended() -> bool:
        got = await http.get(f"/v1/runs/{in_session}", headers=AUTH)
        return bool(got.json()["run"]["status"] == "canceled")

    await eventually(ended, timeout=20)


async def test_a_slow_reader_slows_neither_the_run_nor_other_readers(
    http: httpx.AsyncClient,
) -> None:
    tokens = [f"{i} " for i in range(300)]
    run_id = (await _submit(http, {"input": {"tokens": tokens, "token_delay_ms": 2}})).json()[
        "run"
    ]["run_id"]

    async def slow_reader() -> list[Frame]:
        frames: list[Frame] = []
        async with http.stream("GET", f"/v1/runs/{run_id}/frames", headers=AUTH) as response:
            async for _, frame in sse_frames(response):
                frames.append(frame)
                await pace(0.02, "a slow reader: 20 ms a frame, 6 s for the run's 300")
        return frames

    slow = asyncio.create_task(slow_reader())
    fast = await asyncio.wait_for(_frames(http, run_id), 20)
    assert fast[-1].type == FrameType.DONE
    # The run and a fast reader are done while the slow reader is still far behind ...
    assert not slow.done()
    got = await http.get(f"/v1/runs/{run_id}", headers=AUTH)
    assert got.json()["run"]["status"] == "finished"
    # ... which still gets every frame, in order.
    slow_frames = await asyncio.wait_for(slow, 60)
    assert [f.seq for f in slow_frames] == [f.seq for f in fast]


async def _ids_and_text(http: httpx.AsyncClient, run_id: str) -> tuple[list[int], str]:
    """A light reader (a thousand run at once): the event ids and the text."""
    ids: list[int] = []
    text = []
    async with http.stream("GET", f"/v1/runs/{run_id}/frames", headers=AUTH) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("id: "):
                ids.append(int(line[4:]))
            elif line.startswith("data: ") and '"type":"message"' in line:
                text.append(json.loads(line[6:])["data"]["text"])
    return ids, "".join(text)


# The thousand readers share one event loop with the executor: a lease of a second could
# lapse while they connect, and a retried attempt is not what this test is about.
# One frame per delta, as the test counts them.
@pytest.mark.stack(lease_ttl_ms=30_000, coalesce_text=False)
async def test_a_thousand_readers_of_one_run_all_get_every_frame(
    http: httpx.AsyncClient,
) -> None:
    tokens = [f"{i} " for i in range(20)]
    body = {"input": {"tokens": tokens, "token_delay_ms": 100}}
    run_id = (await _submit(http, body)).json()["run"]["run_id"]
    limits = httpx.Limits(max_connections=1100, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=http.base_url, timeout=120, limits=limits) as many:
        readers = await asyncio.gather(*(_ids_and_text(many, run_id) for _ in range(1000)))
    # Every reader got the run's whole stream, as a reader after its end gets it.
    stored = await _frames(http, run_id)
    assert stored[-1].type == FrameType.DONE
    assert [f.seq for f in stored] == list(range(1, len(tokens) + 3))  # run, tokens, done
    assert sum(ids == [f.seq for f in stored] for ids, _ in readers) == 1000
    assert {text for _, text in readers} == {"".join(tokens)}


async def test_browsers_of_the_allowed_origins_only_may_call_the_api(
    stack: InProcessStack, tmp_path: Path
) -> None:
    allowed = "http://app.example"
    async with (
        serve_gateway(
            stack.nats_url,
            stack.prefix,
            {KEY: "default"},
            tmp_path,
            gateway_cors_origins=[allowed],
        ) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as http,
    ):
        preflight = {
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        }
        ok = await http.options("/v1/runs", headers={"Origin": allowed, **preflight})
        assert ok.status_code == 200
        assert ok.headers["access-control-allow-origin"] == allowed
        other = await http.options(
            "/v1/runs", headers={"Origin": "http://evil.example", **preflight}
        )
        assert "access-control-allow-origin" not in other.headers
        # The LangGraph SDK's threads.update and threads.delete, from the browser.
        for method in ("PATCH", "DELETE"):
            asked = {**preflight, "Access-Control-Request-Method": method}
            thread = await http.options("/threads/t1", headers={"Origin": allowed, **asked})
            assert thread.status_code == 200, method
            assert method in thread.headers["access-control-allow-methods"]


async def test_a_delayed_run_and_webhooks_over_http(http: httpx.AsyncClient) -> None:
    later = await _submit(http, {"input": {"tokens": ["later"]}, "delay_ms": 3_600_000})
    assert later.status_code == 201
    run_id = later.json()["run"]["run_id"]
    shown = (await http.get(f"/v1/runs/{run_id}", headers=AUTH)).json()["run"]
    assert shown["queued_for"] == "time"
    moved = await http.post(f"/v1/runs/{run_id}/reschedule", json={"delay_ms": 0}, headers=AUTH)
    assert moved.status_code == 200, moved.text
    frames = await _frames(http, run_id)
    assert frames[-1].type == FrameType.DONE
    again = await http.post(f"/v1/runs/{run_id}/reschedule", json={"delay_ms": 5}, headers=AUTH)
    assert (again.status_code, again.json()["error"]["code"]) == (409, "NOT_RESCHEDULABLE")
    both = await http.post(
        f"/v1/runs/{run_id}/reschedule",
        json={"delay_ms": 5, "not_before": "2030-01-01T00:00:00Z"},
        headers=AUTH,
    )
    assert both.status_code == 400

    endpoint = {"url": "https://hooks.example.com/runwire", "events": ["ended"]}
    made = await http.put("/v1/webhooks", json={"endpoints": [endpoint]}, headers=AUTH)
    assert made.status_code == 200, made.text
    assert made.json()["secret"].startswith("whsec_")
    read = (await http.get("/v1/webhooks", headers=AUTH)).json()
    assert (read["endpoints"], read["secret"]) == ([endpoint], None)
    bad = await http.put("/v1/webhooks", json={"endpoints": [{"url": "ftp://x"}]}, headers=AUTH)
    assert bad.status_code == 400
