"""A run's frames as LangGraph stream events, in the order LangGraph's server sends them
for a `MessagesState` graph: `metadata`; `values` as the run starts (the thread's values
with the run's input); per text delta `messages` (`messages-tuple`: `[chunk, metadata]`)
or `messages/metadata` then `messages/partial` (`messages`), and a closing empty chunk;
`updates` (`{runner: {"messages": [answer]}}`, a workflow node's output as it completes);
the final `values`; `error` when the run did not finish. `custom` carries every other
frame (`{"type", "data"}`). `events` is a subset of LangChain's astream_events:
`on_chain_start` (the input), `on_chat_model_stream` per delta, `on_chat_model_end` (the
answer), `on_chain_end` (the final values). An interrupt the run now waits for ends the stream with
`__interrupt__` in `updates` and `values`. Event ids are frame seqs: a client that comes
back with `Last-Event-ID` misses and repeats nothing."""

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import runwire.gateway.langgraph.values as lgvalues
from runwire.client.sdk import Client
from runwire.contracts.errors import ErrorCode
from runwire.contracts.frames import FrameType, Transcript, WaitKind
from runwire.contracts.replies import RunSummary
from runwire.contracts.status import RunStatus

# How long a `wait` frame's attempt may take to end (its run then waits), asked every
# ASKED_POLL_S, before the stream goes on past it.
ASKED_WITHIN_S = 10.0
ASKED_POLL_S = 0.02
TEXT_MODES = {"messages", "messages-tuple"}

Start = Callable[[], Awaitable[dict[str, Any]]]


def interrupt_of(run: RunSummary, *, schema: bool = False) -> list[dict[str, Any]] | None:
    """The question a run waits for an answer to, as LangGraph's `__interrupt__` (with
    `response_schema`, as stream events carry it, when `schema`); None when it does not
    wait for one (a signal or a timer goes on by itself)."""
    wait = run.waiting_for
    if run.status != RunStatus.WAITING or wait is None or wait.kind != WaitKind.INTERRUPT:
        return None
    question: dict[str, Any] = {"value": wait.payload, "id": wait.wait_id}
    if schema:
        question["response_schema"] = None
    return [question]


def error_of(run: RunSummary) -> dict[str, Any]:
    """Why a run did not finish, as LangGraph's `{"error", "message"}`."""
    error = run.error
    return {
        "error": (error.code if error else ErrorCode.CANCELED).value,
        "message": error.message if error else f"the run ended {run.status}",
    }


async def asked_now(
    client: Client, run_id: str, wait_id: Any, attempt: int | None
) -> tuple[RunSummary, list[dict[str, Any]] | None]:
    """At a `wait` frame of attempt `attempt` (None: not known): the run, and its
    question when the run now waits for the answer to that wait; None when the wait is
    no interrupt, or was answered already. The frame is published just before its
    attempt ends to wait: while that attempt still runs, the run is asked again."""
    deadline = asyncio.get_running_loop().time() + ASKED_WITHIN_S
    while True:
        run = await client.get(run_id)
        interrupt = interrupt_of(run)
        if interrupt is not None:
            return run, interrupt if interrupt[0]["id"] == wait_id else None
        ending = run.status in (RunStatus.RUNNING, RunStatus.RECOVERING) and (
            attempt is None or run.attempts == attempt
        )
        if not ending or asyncio.get_running_loop().time() > deadline:
            return run, None
        await asyncio.sleep(ASKED_POLL_S)


def event(name: str, data: Any, event_id: int | None = None) -> bytes:
    """One server-sent event."""
    head = f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n"
    return (head + (f"id: {event_id}\n" if event_id is not None else "") + "\n").encode()


class _Answer:
    """The events of a run's answer as its text deltas arrive."""

    def __init__(self, run_id: str, thread_id: str | None, assistant: str, modes: list[str]):
        self.run_id, self.modes, self.node = run_id, modes, assistant
        self.text = ""
        self.open = False
        self.metadata = {
            "graph_id": assistant,
            "assistant_id": lgvalues.assistant_id(assistant),
            "run_id": run_id,
            "thread_id": thread_id,
            "langgraph_node": assistant,
            "langgraph_step": 1,
            "langgraph_triggers": ["branch:to:" + assistant],
            "langgraph_path": ["__pregel_pull", assistant],
            "ls_provider": "runwire",
        }

    def lc_event(self, kind: str, name: str, data: dict[str, Any]) -> tuple[str, Any]:
        """A LangChain callback event (stream mode `events`)."""
        body = {
            "event": kind,
            "name": name,
            "run_id": self.run_id,
            "tags": [],
            "metadata": self.metadata,
            "parent_ids": [],
            "data": data,
        }
        return "events", body

    def delta(self, text: str) -> list[tuple[str, Any]]:
        self.text += text
        events: list[tuple[str, Any]] = []
        if "events" in self.modes:
            data = {"chunk": lgvalues.chunk(self.run_id, text)}
            events.append(self.lc_event("on_chat_model_stream", self.node, data))
        if "messages-tuple" in self.modes:
            events.append(("messages", [lgvalues.chunk(self.run_id, text), self.metadata]))
        if "messages" in self.modes:
            if not self.open:
                meta = {lgvalues.answer_id(self.run_id): {"metadata": self.metadata}}
                events.append(("messages/metadata", meta))
            events.append(("messages/partial", [lgvalues.answer(self.run_id, self.text)]))
        self.open = True
        return events

    def close(self) -> list[tuple[str, Any]]:
        """The answer's end (an empty closing chunk), once, if it had text."""
        if not self.open:
            return []
        self.open = False
        events: list[tuple[str, Any]] = []
        if "messages-tuple" in self.modes:
            last = lgvalues.chunk(self.run_id, "", last=True)
            events.append(("messages", [last, self.metadata]))
        if "messages" in self.modes:
            events.append(("messages/partial", [lgvalues.answer(self.run_id, self.text)]))
        if "events" in self.modes:
            last = {"chunk": lgvalues.chunk(self.run_id, "", last=True)}
            events.append(self.lc_event("on_chat_model_stream", self.node, last))
            data = {"output": lgvalues.answer(self.run_id, self.text)}
            events.append(self.lc_event("on_chat_model_end", self.node, data))
        return events


async def stream_events(
    client: Client,
    run_id: str,
    assistant: str,
    modes: list[str],
    after: int,
    start: Start,
    *,
    given: Start | None = None,
    thread_id: str | None = None,
    metadata: bool = False,
) -> AsyncIterator[bytes]:
    """The run's frames after `after` as LangGraph stream events (`metadata` first from
    the start, or when asked: a resumed run's stream); ends at `done`, or at the question
    of an interrupt the run waits for. `start`: the values as the run starts; `given`:
    its input as the request gave it (for `events`)."""
    transcript = Transcript()
    answer = _Answer(run_id, thread_id, assistant, modes)
    if after == 0 or metadata:
        yield event("metadata", {"run_id": run_id, "attempt": 1}, after)
    if after > 0:
        # The text before the cursor: the final values and answer hold all of it.
        async for frame in client.stream(run_id, 0):
            transcript.apply(frame)
            if frame.seq >= after or frame.type == FrameType.DONE:
                break
    started = False
    attempt: int | None = None  # of the frames read, once a `run` frame said
    async for frame in client.stream(run_id, after):
        events: list[tuple[str, Any]] = []
        transcript.apply(frame)
        if frame.type == FrameType.RUN:
            attempt = frame.data.get("attempt")
            if not started and "events" in modes:
                data = {"input": await given() if given else {}}
                events.append(answer.lc_event("on_chain_start", assistant, data))
            if not started and "values" in modes:
                events.append(("values", await start()))
            started = True
        elif frame.type == FrameType.MESSAGE:
            events += answer.delta(frame.data.get("text", ""))
        elif frame.type == FrameType.DONE:
            events += answer.close()
            run = await client.get(run_id)
            if run.status == RunStatus.FINISHED:
                final = lgvalues.answered(await start(), run_id, transcript.text)
                if "updates" in modes:
                    reply = lgvalues.answer(run_id, transcript.text)
                    events.append(("updates", {assistant: {"messages": [reply]}}))
                if "values" in modes:
                    events.append(("values", final))
                if "events" in modes:
                    data = {"output": final}
                    events.append(answer.lc_event("on_chain_end", assistant, data))
            else:
                events.append(("error", error_of(run)))
        elif frame.type == FrameType.WAIT:
            # The question the run waits for now ends the stream; one answered already
            # (a stream read again later, or the resumed run's) is passed over.
            _, interrupt = await asked_now(client, run_id, frame.data.get("wait_id"), attempt)
            if interrupt is not None:
                events += answer.close()
                for question in interrupt:
                    question["response_schema"] = None
                if "updates" in modes:
                    events.append(("updates", {"__interrupt__": interrupt}))
                if "values" in modes:
                    events.append(("values", {**(await start()), "__interrupt__": interrupt}))
                if "custom" in modes:
                    events.append(("custom", {"type": frame.type, "data": frame.data}))
                for i, (name, data) in enumerate(events):
                    yield event(name, data, frame.seq if i == len(events) - 1 else None)
                return
        elif (
            frame.type == FrameType.NODE
            and frame.data.get("action") == "completed"
            and "updates" in modes
        ):
            run = await client.get(run_id)
            outputs = {n.node_id: n.output for n in run.nodes if n.node_id == frame.data["node_id"]}
            events.append(("updates", outputs))
        if "custom" in modes and frame.type not in (FrameType.MESSAGE, FrameType.DONE):
            events.append(("custom", {"type": frame.type, "data": frame.data}))
        # Only the last event of a frame carries its id: a client that comes back with
        # it has every event of the frame.
        for i, (name, data) in enumerate(events):
            yield event(name, data, frame.seq if i == len(events) - 1 else None)
        if frame.type == FrameType.DONE:
            return
