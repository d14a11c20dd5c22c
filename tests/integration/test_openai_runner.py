"""The `openai` runner against an OpenAI-compatible HTTP server the test starts (real
SSE over TCP): answers, tools, provider errors, streams cut or stalled, cancels, and a
configuration that changed under a run."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import runwire
from runwire.contracts.errors import ErrorCode
from runwire.contracts.frames import Frame, FrameType
from runwire.contracts.status import RunStatus
from runwire.runners.openai_chat import RESUME_INSTRUCTION, OpenAISettings, make_runner
from runwire.testing.servers import Servers
from runwire.testing.waiting import eventually
from tests.effect_server import EffectServer
from tests.openai_server import OpenAIServer, Status, Stream, text_answer, tool_call_answer
from tests.runners import MAIL_API, send_email
from tests.services import InProcessStack, collect
from tests.traces import InProcessSpans

pytestmark = pytest.mark.integration

KEY = "sk-test-0123456789abcdefSECRET"
HELLO = {"model": "test-model", "messages": [{"role": "user", "content": "Say hello"}]}


class City(BaseModel):
    city: str


WEATHER_CALLS: list[str] = []


@runwire.tool(input=City)
async def get_weather(args: City) -> dict[str, Any]:
    """The weather in a city."""
    WEATHER_CALLS.append(args.city)
    return {"city": args.city, "sky": "sunny", "celsius": 21}


def settings(server: OpenAIServer, **extra: Any) -> OpenAISettings:
    return OpenAISettings(base_url=server.base_url, api_key=KEY, **extra)


@asynccontextmanager
async def openai_stack(
    infra: Servers,
    db_url: str,
    prefix: str,
    server: OpenAIServer,
    *,
    executors: int = 1,
    tools: dict[str, Any] | None = None,
    **overrides: Any,
) -> AsyncIterator[InProcessStack]:
    stack = InProcessStack(
        infra.nats_url,
        db_url,
        prefix,
        overrides=overrides,
        executors=executors,
        runners={"openai": make_runner(settings(server))},
        tools={"get_weather": get_weather, **(tools or {})},
    )
    async with stack:
        yield stack


def of_type(frames: list[Frame], type: FrameType) -> list[dict[str, Any]]:
    return [f.data for f in frames if f.type == type]


async def test_a_streamed_answer_arrives_as_message_frames_with_its_usage(
    infra: Servers, db_url: str, prefix: str
) -> None:
    # One frame per chunk: the server sends them all at once, and the deltas of a fast
    # model would join into fewer frames.
    async with (
        OpenAIServer() as server,
        openai_stack(infra, db_url, prefix, server, coalesce_text=False) as stack,
    ):
        server.queue(Stream(text_answer("Hel", "lo", " world", prompt_tokens=7)))
        reply = await stack.client.submit({**HELLO, "temperature": 0.2}, runner="openai")
        frames, transcript = await collect(stack.client, reply.run.run_id)
        run = await stack.client.get(reply.run.run_id)
    (request,) = server.requests

    assert transcript.text == "Hello world"
    assert [d["text"] for d in of_type(frames, FrameType.MESSAGE)] == ["Hel", "lo", " world"]
    assert of_type(frames, FrameType.USAGE) == [
        {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10, "model": "test-model"}
    ]
    assert run.status == RunStatus.FINISHED
    assert run.result is not None
    assert run.result["usage"] == {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10}
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.body["model"] == "test-model"
    assert request.body["messages"] == HELLO["messages"]
    assert request.body["temperature"] == 0.2
    assert request.body["stream"] is True
    assert request.body["stream_options"] == {"include_usage": True}
    assert "tools" in request.body  # the registered tool is offered


async def test_a_registered_tool_is_called_and_the_loop_goes_on(
    infra: Servers, db_url: str, prefix: str
) -> None:
    async with OpenAIServer() as server, openai_stack(infra, db_url, prefix, server) as stack:
        server.queue(
            Stream(tool_call_answer("call_1", "get_weather", '{"city": "Paris"}')),
            Stream(text_answer("Sunny", " in Paris")),
        )
        reply = await stack.client.submit(HELLO, runner="openai")
        frames, transcript = await collect(stack.client, reply.run.run_id)
        run = await stack.client.get(reply.run.run_id)
    first, second = server.requests

    assert of_type(frames, FrameType.TOOL_CALL) == [
        {"id": "call_1", "name": "get_weather", "arguments": {"city": "Paris"}}
    ]
    assert of_type(frames, FrameType.TOOL_RESULT) == [
        {
            "id": "call_1",
            "name": "get_weather",
            "output": {"city": "Paris", "sky": "sunny", "celsius": 21},
            "error": None,
        }
    ]
    assert transcript.text == "Sunny in Paris"
    assert len(of_type(frames, FrameType.USAGE)) == 2
    assert run.result is not None
    assert run.result["steps"] == 2
    offered = first.body["tools"][0]["function"]
    assert offered["name"] == "get_weather"
    assert offered["description"] == "The weather in a city."
    assert offered["parameters"]["properties"]["city"]["type"] == "string"
    assistant, tool = second.body["messages"][-2:]
    assert assistant["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": '{"city": "Paris"}',
    }
    assert tool["role"] == "tool"
    assert tool["tool_call_id"] == "call_1"
    assert json.loads(tool["content"]) == {"city": "Paris", "sky": "sunny", "celsius": 21}


async def test_a_call_of_a_tool_the_client_handles_ends_the_run_with_the_call(
    infra: Servers, db_url: str, prefix: str
) -> None:
    ask = {"type": "function", "function": {"name": "ask_user", "parameters": {}}}
    async with OpenAIServer() as server, openai_stack(infra, db_url, prefix, server) as stack:
        server.queue(Stream(tool_call_answer("call_9", "ask_user", '{"question": "Which?"}')))
        reply = await stack.client.submit({**HELLO, "tools": [ask]}, runner="openai")
        frames, _ = await collect(stack.client, reply.run.run_id)
        run = await stack.client.get(reply.run.run_id)

    assert run.status == RunStatus.FINISHED
    assert run.result is not None
    assert run.result["finish_reason"] == "tool_calls"
    assert run.result["tool_calls"] == [
        {"id": "call_9", "name": "ask_user", "arguments": {"question": "Which?"}}
    ]
    assert run.result["messages"][-1]["tool_calls"][0]["id"] == "call_9"
    assert of_type(frames, FrameType.TOOL_CALL) == run.result["tool_calls"]
    assert of_type(frames, FrameType.TOOL_RESULT) == []
    assert {t["function"]["name"] for t in server.requests[0].body["tools"]} == {
        "get_weather",
        "ask_user",
    }


async def test_a_429_waits_out_retry_after_before_the_next_attempt(
    infra: Servers, db_url: str, prefix: str
) -> None:
    async with OpenAIServer() as server, openai_stack(infra, db_url, prefix, server) as stack:
        server.queue(Status(429, "slow down", {"retry-after": "2"}), Stream(text_answer("ok")))
        reply = await stack.client.submit(HELLO, runner="openai")
        frames, transcript = await collect(stack.client, reply.run.run_id)
        run = await stack.client.get(reply.run.run_id)
    first, second = server.requests

    assert second.at - first.at >= 2.0
    assert transcript.text == "ok"
    assert (run.status, run.attempts) == (RunStatus.FINISHED, 2)
    (error,) = of_type(frames, FrameType.ERROR)
    assert error["code"] == ErrorCode.RUNNER_ERROR
    assert error["retryable"] is True
    assert "429" in error["message"]
    assert "slow down" in error["message"]


async def test_retryable_statuses_are_retried_and_fatal_ones_fail_the_run(
    infra: Servers,
    db_url: str,
    prefix: str,
    caplog: pytest.LogCaptureFixture,
    spans: InProcessSpans,
) -> None:
    caplog.set_level(logging.DEBUG)
    outcomes: dict[int, Any] = {}
    async with OpenAIServer() as server, openai_stack(infra, db_url, prefix, server) as stack:
        for code in (408, 409, 500, 503, 400, 401, 403, 404, 422):
            # A provider that quotes the key back must not make it leak.
            server.queue(Status(code, f"status {code} for key {KEY}"), Stream(text_answer("ok")))
            reply = await stack.client.submit(HELLO, runner="openai")
            frames, _ = await collect(stack.client, reply.run.run_id)
            outcomes[code] = (await stack.client.get(reply.run.run_id), frames)
            server.replies.clear()

    for code in (408, 409, 500, 503):
        run, _ = outcomes[code]
        assert (run.status, run.attempts) == (RunStatus.FINISHED, 2), code
    for code in (400, 401, 403, 404, 422):
        run, frames = outcomes[code]
        assert (run.status, run.attempts) == (RunStatus.FAILED, 1), code
        assert run.error is not None
        assert run.error.code == ErrorCode.RUNNER_FATAL
        assert not run.error.retryable
        assert f"status {code} for key" in run.error.message
    every_frame = json.dumps([[f.model_dump(mode="json") for f in o[1]] for o in outcomes.values()])
    every_error = json.dumps([o[0].model_dump(mode="json") for o in outcomes.values()])
    assert KEY not in every_frame
    assert KEY not in every_error
    assert "[redacted]" in every_error
    assert KEY not in caplog.text
    seen = spans.spans
    assert any(span.name == "runner" for span in seen)
    assert KEY not in json.dumps([[s.name, s.attributes] for s in seen], default=str)


async def test_a_stream_cut_mid_answer_resumes_from_what_the_user_saw(
    infra: Servers, db_url: str, prefix: str
) -> None:
    async with OpenAIServer() as server, openai_stack(infra, db_url, prefix, server) as stack:
        # The role chunk, "Once", " upon", then the connection drops.
        server.queue(
            Stream(text_answer("Once", " upon", " a", " time"), cut_after=3),
            Stream(text_answer(" a", " time")),
        )
        reply = await stack.client.submit(HELLO, runner="openai")
        frames, transcript = await collect(stack.client, reply.run.run_id)
        run = await stack.client.get(reply.run.run_id)
    _, resumed = server.requests

    assert transcript.text == "Once upon a time"
    assert (run.status, run.attempts) == (RunStatus.FINISHED, 2)
    (error,) = of_type(frames, FrameType.ERROR)
    assert error["retryable"] is True
    assert resumed.body["messages"][-2:] == [
        {"role": "assistant", "content": "Once upon"},
        {"role": "system", "content": RESUME_INSTRUCTION},
    ]
    runs = of_type(frames, FrameType.RUN)
    assert runs[1]["resumed"] is True


async def test_a_stall_past_the_deadline_closes_the_connection_and_retries(
    infra: Servers, db_url: str, prefix: str
) -> None:
    async with OpenAIServer() as server, openai_stack(infra, db_url, prefix, server) as stack:
        server.queue(
            Stream(text_answer("never", " ends"), stall_after=2), Stream(text_answer("ok"))
        )
        reply = await stack.client.submit(HELLO, runner="openai", attempt_timeout_ms=1000)
        frames, transcript = await collect(stack.client, reply.run.run_id)
        run = await stack.client.get(reply.run.run_id)
    stalled = server.requests[0]

    assert stalled.closed_at is not None
    # The deadline runs from the start of the attempt, a little before the request.
    assert 0.5 <= stalled.closed_at - stalled.at < 1.5
    assert (run.status, run.attempts) == (RunStatus.FINISHED, 2)
    assert transcript.text == "neverok"
    assert of_type(frames, FrameType.ERROR)[0]["code"] == ErrorCode.ATTEMPT_TIMEOUT


async def test_a_cancel_closes_the_model_stream_within_100_ms(
    infra: Servers, db_url: str, prefix: str
) -> None:
    async with OpenAIServer() as server, openai_stack(infra, db_url, prefix, server) as stack:
        server.queue(Stream(text_answer(*["tok "] * 500), delay_s=0.01))
        reply = await stack.client.submit(HELLO, runner="openai")
        (request,) = await server.wait_for_requests(1)

        async def streaming() -> bool:
            run = await stack.client.get(reply.run.run_id)
            return run.last_seq >= 5

        await eventually(streaming, timeout=10)
        await stack.client.cancel(reply.run.run_id)
        # From the moment the cancel is accepted (its reply), as for any runner: the
        # command's own round trip is the submitter's, timed by its metrics.
        canceled_at = time.monotonic()
        await asyncio.wait_for(request.closed.wait(), 5)
        frames, _ = await collect(stack.client, reply.run.run_id)

    assert request.closed_at is not None
    assert request.closed_at - canceled_at < 0.1
    assert frames[-1].data["status"] == RunStatus.CANCELED


async def test_a_changed_model_configuration_fails_the_run_with_model_changed(
    infra: Servers, db_url: str, prefix: str
) -> None:
    async with (
        OpenAIServer() as first,
        OpenAIServer() as moved,
        openai_stack(infra, db_url, prefix, first, executors=0) as stack,
    ):
        # The first attempt stalls; its executor shuts down and hands the run back.
        first.queue(Stream(text_answer("partial"), stall_after=2))
        stack.start_executor("old", runners={"openai": make_runner(settings(first))})
        reply = await stack.client.submit(HELLO, runner="openai")
        await first.wait_for_requests(1)
        await stack.stop_service("old")
        # The next executor sends its requests elsewhere: not the configuration pinned.
        stack.start_executor("new", runners={"openai": make_runner(settings(moved))})
        frames, _ = await collect(stack.client, reply.run.run_id)
        run = await stack.client.get(reply.run.run_id)

    assert run.status == RunStatus.FAILED
    assert run.error is not None
    assert run.error.code == ErrorCode.MODEL_CHANGED
    assert run.error.retryable is False
    assert moved.requests == []
    assert frames[-1].data == {"status": "failed", "code": "MODEL_CHANGED"}


async def test_a_run_without_a_model_is_refused_at_submit(
    infra: Servers, db_url: str, prefix: str
) -> None:
    async with OpenAIServer() as server, openai_stack(infra, db_url, prefix, server) as stack:
        with pytest.raises(runwire.ClientError) as refused:
            await stack.client.submit({"messages": HELLO["messages"]}, runner="openai")
        with pytest.raises(runwire.ClientError) as typo:
            await stack.client.submit({**HELLO, "temprature": 1}, runner="openai")
    assert refused.value.code == ErrorCode.INVALID_REQUEST
    assert "model" in refused.value.message
    assert typo.value.code == ErrorCode.INVALID_REQUEST
    assert "temprature" in typo.value.message
    assert server.requests == []


async def test_a_resumed_attempt_rebuilds_the_tool_steps_and_calls_no_tool_again(
    infra: Servers, db_url: str, prefix: str
) -> None:
    WEATHER_CALLS.clear()
    async with OpenAIServer() as server, openai_stack(infra, db_url, prefix, server) as stack:
        server.queue(
            Stream(tool_call_answer("call_1", "get_weather", '{"city": "Oslo"}')),
            # The answer after the tool's result is cut after "It is".
            Stream(text_answer("It is", " sunny", "."), cut_after=2),
            Stream(text_answer(" sunny", ".")),
        )
        reply = await stack.client.submit(HELLO, runner="openai")
        _, transcript = await collect(stack.client, reply.run.run_id)
        run = await stack.client.get(reply.run.run_id)
    resumed = server.requests[2]

    assert transcript.text == "It is sunny."
    assert (run.status, run.attempts) == (RunStatus.FINISHED, 2)
    assert WEATHER_CALLS == ["Oslo"]  # the second attempt did not call the tool again
    user, assistant, tool, partial, instruction = resumed.body["messages"]
    assert user == HELLO["messages"][0]
    assert assistant["tool_calls"][0]["id"] == "call_1"
    assert assistant["tool_calls"][0]["function"]["name"] == "get_weather"
    assert (tool["role"], tool["tool_call_id"]) == ("tool", "call_1")
    assert json.loads(tool["content"])["city"] == "Oslo"
    assert partial == {"role": "assistant", "content": "It is"}
    assert instruction == {"role": "system", "content": RESUME_INSTRUCTION}


async def test_a_model_that_keeps_calling_tools_fails_at_max_steps(
    infra: Servers, db_url: str, prefix: str
) -> None:
    async with OpenAIServer() as server, openai_stack(infra, db_url, prefix, server) as stack:
        server.queue(
            Stream(tool_call_answer("call_1", "get_weather", '{"city": "Rome"}')),
            Stream(tool_call_answer("call_2", "get_weather", '{"city": "Rome"}')),
        )
        reply = await stack.client.submit({**HELLO, "max_steps": 2}, runner="openai")
        frames, _ = await collect(stack.client, reply.run.run_id)
        run = await stack.client.get(reply.run.run_id)

    assert len(server.requests) == 2
    assert len(of_type(frames, FrameType.TOOL_RESULT)) == 2
    assert run.status == RunStatus.FAILED
    assert run.error is not None
    assert run.error.code == ErrorCode.RUNNER_FATAL
    assert "max_steps" in run.error.message


EXAMPLE_WORKFLOW = Path(__file__).parents[2] / "examples" / "workflows" / "support_reply.json"


async def test_the_example_workflow_falls_back_to_the_cheaper_model(
    infra: Servers, db_url: str, prefix: str
) -> None:
    async with OpenAIServer() as server, openai_stack(infra, db_url, prefix, server) as stack:
        server.queue(
            Status(400, "model gpt-4o is not available to you"),  # `answer`: fatal
            Stream(text_answer("Tyres ", "are 20% off.")),  # `answer_mini`, in its place
            Stream(text_answer("Good news: tyres are 20% off!")),  # `review`
        )
        definition = json.loads(EXAMPLE_WORKFLOW.read_text())
        await stack.client.release("support-reply", 1, definition)
        reply = await stack.client.submit_workflow(
            "support-reply", {"question": "Any deals on tyres?"}
        )
        frames, _ = await collect(stack.client, reply.run.run_id, timeout=60)
        run = await stack.client.get(reply.run.run_id)

    assert run.status == RunStatus.FINISHED
    assert {n.node_id: n.status.value for n in run.nodes} == {
        "answer": "failed",
        "answer_mini": "completed",
        "review": "completed",
    }
    nodes = [(f.data["node_id"], f.data["action"]) for f in frames if f.type == FrameType.NODE]
    assert ("answer", "fell_back") in nodes
    # Each model got what the release maps into it: the question, then the answer.
    asked = [(r.body["model"], r.body["messages"][-1]["content"]) for r in server.requests]
    assert asked == [
        ("gpt-4o", "Any deals on tyres?"),
        ("gpt-4o-mini", "Any deals on tyres?"),
        ("gpt-4o-mini", "Tyres are 20% off."),
    ]
    assert run.result is not None
    assert run.result["outputs"]["review"]["text"] == "Good news: tyres are 20% off!"


async def _waiting(stack: InProcessStack, run_id: str) -> runwire.contracts.RunSummary:
    async def waits() -> runwire.contracts.RunSummary | None:
        run = await stack.client.get(run_id)
        assert not run.status.terminal, run.error
        return run if run.status == RunStatus.WAITING else None

    return await eventually(waits, timeout=20)


@pytest.mark.parametrize(
    "answer", ["approve with other arguments", "approve from the console", "reject"]
)
async def test_a_tool_that_needs_approval_waits_for_a_person(
    infra: Servers, db_url: str, prefix: str, answer: str
) -> None:
    """The call becomes the run's question (no worker held meanwhile); approved, the
    tool runs once, with the arguments the person gave; rejected, it does not run and
    the model reads why."""
    called = len(WEATHER_CALLS)
    async with OpenAIServer() as server, openai_stack(infra, db_url, prefix, server) as stack:
        server.queue(
            Stream(tool_call_answer("call_1", "get_weather", '{"city": "Paris"}')),
            Stream(text_answer("Done")),
        )
        body = {**HELLO, "approve_tools": ["get_weather"]}
        run_id = (await stack.client.submit(body, runner="openai")).run.run_id
        waiting = await _waiting(stack, run_id)
        assert waiting.waiting_for is not None
        call = {"id": "call_1", "name": "get_weather", "arguments": {"city": "Paris"}}
        assert waiting.waiting_for.payload == {"tool_call": call}
        assert len(WEATHER_CALLS) == called  # not before the answer
        if answer == "reject":
            value: Any = {"approve": False, "reason": "not now"}
        elif answer == "approve from the console":  # its Approve button's value
            value = {"approved": True}
        else:
            value = {"approve": True, "arguments": {"city": "Lyon"}}
        await stack.client.resume(run_id, value, wait_id=waiting.waiting_for.wait_id)
        frames, transcript = await collect(stack.client, run_id)
        run = await stack.client.get(run_id)
    assert run.status == RunStatus.FINISHED, run.error
    assert transcript.text == "Done"
    assert of_type(frames, FrameType.TOOL_CALL) == [call]  # once, not again on resume
    (result,) = of_type(frames, FrameType.TOOL_RESULT)
    _, second = server.requests  # the model was not asked again for the call
    tool = second.body["messages"][-1]
    assert tool["tool_call_id"] == "call_1"
    if answer == "reject":
        assert WEATHER_CALLS[called:] == []
        assert result["error"] == "a person rejected the call: not now"
        assert json.loads(tool["content"]) == {"error": "a person rejected the call: not now"}
    else:
        city = "Paris" if answer == "approve from the console" else "Lyon"
        assert WEATHER_CALLS[called:] == [city]
        assert result["output"]["city"] == city
        assert json.loads(tool["content"])["city"] == city


async def test_an_approved_call_that_sends_an_email_sends_it_once(
    infra: Servers, db_url: str, prefix: str
) -> None:
    """A tool that performs a side effect, approved by a person: the email goes once,
    although the attempt after the approval fails and the next one goes on."""
    call = {"to": "ada@example.com", "subject": "hello"}
    async with (
        EffectServer() as mail,
        OpenAIServer() as server,
        openai_stack(infra, db_url, prefix, server, tools={"send_email": send_email}) as stack,
    ):
        MAIL_API.update(url=mail.url, status="")
        await stack.allow_effects("http")
        await stack.client.set_budget(cost=10)
        server.queue(
            Stream(tool_call_answer("call_1", "send_email", json.dumps(call))),
            # The answer after the email's result is cut: the attempt fails, the next
            # one goes on from the conversation rebuilt from the frames.
            Stream(text_answer("Sent", " it."), cut_after=2),
            Stream(text_answer(" it.")),
        )
        body = {**HELLO, "approve_tools": ["send_email"]}
        run_id = (await stack.client.submit(body, runner="openai")).run.run_id
        waiting = await _waiting(stack, run_id)
        assert waiting.waiting_for is not None
        assert mail.emails == {}  # nothing sent before the answer
        await stack.client.resume(run_id, {"approved": True})
        frames, transcript = await collect(stack.client, run_id)
        run = await stack.client.get(run_id)
    assert run.status == RunStatus.FINISHED, run.error
    assert transcript.text == "Sent it."
    assert run.attempts == 3  # asked, approved and cut, went on
    assert list(mail.emails.values()) == [1]
    (result,) = of_type(frames, FrameType.TOOL_RESULT)
    assert result["output"] == {"sent": "em_1"}
    assert [e.key for e in run.effects] == ["call_1:email"]
