"""The part of the LangGraph runs API that the official `langgraph-sdk` clients use, so
that they work against runwire unchanged (docs/langgraph-sdk.md says what they send).

A thread is a session: its runs are the session's runs, and `multitask_strategy` is the
session rule (`reject` → 409, `interrupt`, `enqueue`, the default; `rollback` acts as
`interrupt`: runwire keeps no thread state to roll back). `assistant_id` names the
runner and `input` is the runner's input. Threads themselves (id, metadata, time) are
kept in a key-value bucket of the broker, so any gateway replica knows them.

Stream events: `metadata` (`run_id`, `attempt`) first; then, by the modes asked for,
`messages` (`messages-tuple`: `[chunk, metadata]` per text delta), `values` (`{"text":
...}`, the text so far), `updates` (a workflow node's output as it completes, and the
run's result at its end, under the node's or the runner's name), `custom` (every other
frame: `{"type", "data"}`); `error` when the run did not finish; `end`. Event ids are
frame seqs: a client that comes back with `Last-Event-ID` misses and repeats nothing.

Interrupts, as LangGraph shows them: a run whose runner asks (`ctx.interrupt`) and now
waits ends its stream there with `{"__interrupt__": [{"value": <payload>, "id":
<wait_id>}]}` in `updates` and in its last `values` (and `runs.wait`/`join` answer the
values with it); the run reads `success` and its thread `interrupted`, with the question
in the thread's `interrupts`. A run request with `command: {"resume": value}` and no
input answers it: the thread's waiting run goes on (the same run, where LangGraph makes
a new one: runwire resumes the run it checkpointed), streamed from the question on.
"""

import asyncio
import contextlib
import json
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from runwire.client.sdk import Client, ClientError
from runwire.contracts.commands import Multitask, SubmitCommand
from runwire.contracts.errors import ErrorCode
from runwire.contracts.frames import FrameType, Transcript, WaitKind
from runwire.contracts.replies import RunSummary
from runwire.contracts.status import RunStatus
from runwire.gateway.errors import described, status_of
from runwire.gateway.threads import Threads

ClientOf = Callable[[Request], Awaitable[Client]]

# Thread ids are keys of the bucket: letters, digits, '-' and '_'.
THREAD_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
STRATEGIES = {
    "reject": Multitask.REJECT,
    "interrupt": Multitask.INTERRUPT,
    "rollback": Multitask.INTERRUPT,
    "enqueue": Multitask.ENQUEUE,
}
DEFAULT_MODES = ["values"]
# What a run's status is called in the LangGraph API.
RUN_STATUS = {
    RunStatus.QUEUED: "pending",
    RunStatus.RUNNING: "running",
    RunStatus.RECOVERING: "running",
    RunStatus.FINISHED: "success",
    RunStatus.FAILED: "error",
    RunStatus.CANCELED: "interrupted",
    RunStatus.INTERRUPTED: "error",
    # Stopped at an interrupt: LangGraph's run has ended (its thread is `interrupted`).
    RunStatus.WAITING: "success",
}
TIMEOUT_CODES = {ErrorCode.ATTEMPT_TIMEOUT, ErrorCode.QUEUE_TIMEOUT}
# How long a `wait` frame's attempt may take to end (its run then waits), asked every
# ASKED_POLL_S, before the stream goes on past it.
ASKED_WITHIN_S = 10.0
ASKED_POLL_S = 0.02


class RunBody(BaseModel):
    """A run request: what runwire acts on; the other fields the SDK may send are
    accepted and ignored (see docs/gateway.md's list)."""

    model_config = ConfigDict(extra="allow")

    assistant_id: str = Field(min_length=1, max_length=64)
    input: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    multitask_strategy: str | None = None
    if_not_exists: str | None = None
    stream_mode: list[str] | str | None = None
    on_disconnect: str | None = None
    # `{"resume": value}`: the answer to the thread's interrupt (see the module).
    command: dict[str, Any] | None = None


class ThreadBody(BaseModel):
    model_config = ConfigDict(extra="allow")

    thread_id: str | None = None
    metadata: dict[str, Any] | None = None
    if_exists: str | None = None


class Refused(Exception):
    """A request answered with a status and `{"detail": ...}`, as LangGraph's server
    answers (the SDK raises ConflictError on 409, NotFoundError on 404, ...)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


THREAD_ID_RULE = "thread_id: 1-128 letters, digits, '-' or '_'"


def run_object(run: RunSummary, assistant_id: str | None, strategy: str | None) -> dict[str, Any]:
    """A runwire run as the LangGraph API's Run."""
    status = RUN_STATUS[run.status]
    if run.status == RunStatus.FAILED and run.error is not None and run.error.code in TIMEOUT_CODES:
        status = "timeout"
    return {
        "run_id": run.run_id,
        "thread_id": run.session_id,
        "assistant_id": assistant_id or "",
        "created_at": run.created_at.isoformat(),
        "updated_at": run.updated_at.isoformat(),
        "status": status,
        "metadata": {},
        "multitask_strategy": strategy or "enqueue",
        "kwargs": {},
    }


def interrupt_of(run: RunSummary) -> list[dict[str, Any]] | None:
    """The question a run waits for an answer to, as LangGraph's `__interrupt__`; None
    when it does not wait for one (a signal or a timer goes on by itself)."""
    wait = run.waiting_for
    if run.status != RunStatus.WAITING or wait is None or wait.kind != WaitKind.INTERRUPT:
        return None
    return [{"value": wait.payload, "id": wait.wait_id}]


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


def final_values(run: RunSummary, text: str = "") -> dict[str, Any]:
    """What `runs.wait` and `runs.join` answer: the run's result, the text so far and
    the question of a run stopped at an interrupt, or `__error__`."""
    interrupt = interrupt_of(run)
    if interrupt is not None:
        return {"text": text, "__interrupt__": interrupt}
    if run.status == RunStatus.FINISHED:
        return dict(run.result or {})
    error = run.error
    return {
        "__error__": {
            "error": (error.code if error else ErrorCode.CANCELED).value,
            "message": error.message if error else f"the run ended {run.status}",
        }
    }


def _modes(given: list[str] | str | None) -> list[str]:
    if given is None or given == "":
        return list(DEFAULT_MODES)
    if isinstance(given, str):
        with contextlib.suppress(ValueError):
            parsed = json.loads(given)
            if isinstance(parsed, list):
                return [str(m) for m in parsed]
        return [given]
    return [m for m in given if m]


def _event(name: str, data: Any, event_id: int | None = None) -> bytes:
    head = f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n"
    return (head + (f"id: {event_id}\n" if event_id is not None else "") + "\n").encode()


async def stream_events(
    client: Client,
    run_id: str,
    assistant_id: str,
    modes: list[str],
    after: int,
    *,
    metadata: bool = False,
) -> AsyncIterator[bytes]:
    """The run's frames after `after` as LangGraph stream events (first `metadata` from
    the start, or when asked: a resumed run's stream); ends at `done`, or at the
    question of an interrupt the run waits for."""
    transcript = Transcript()
    text_modes = {"messages", "messages-tuple"} & set(modes)
    if after == 0 or metadata:
        yield _event("metadata", {"run_id": run_id, "attempt": 1}, after)
    if after > 0 and "values" in modes:
        # Text before the cursor, so that `values` go on from the text so far.
        async for frame in client.stream(run_id, 0):
            transcript.apply(frame)
            if frame.seq >= after or frame.type == FrameType.DONE:
                break
    attempt: int | None = None  # of the frames read, once a `run` frame said
    async for frame in client.stream(run_id, after):
        events: list[tuple[str, Any]] = []
        before = transcript.text
        transcript.apply(frame)
        if frame.type == FrameType.RUN:
            attempt = frame.data.get("attempt")
        if frame.type == FrameType.MESSAGE:
            delta = frame.data.get("text", "")
            if text_modes:
                chunk = {
                    "type": "AIMessageChunk",
                    "content": delta,
                    "id": f"run-{run_id}",
                    "tool_calls": [],
                    "tool_call_chunks": [],
                }
                events.append(
                    ("messages", [chunk, {"run_id": run_id, "langgraph_node": assistant_id}])
                )
            if "values" in modes:
                events.append(("values", {"text": transcript.text}))
        elif frame.type == FrameType.RUN:
            if frame.data.get("attempt", 1) > 1 and "values" in modes and transcript.text != before:
                events.append(("values", {"text": transcript.text}))
            if "custom" in modes:
                events.append(("custom", {"type": frame.type, "data": frame.data}))
        elif frame.type == FrameType.DONE:
            run = await client.get(run_id)
            if run.status == RunStatus.FINISHED:
                if "updates" in modes:
                    events.append(("updates", {assistant_id: run.result or {}}))
            else:
                events.append(("error", final_values(run)["__error__"]))
            events.append(("end", None))
        elif frame.type == FrameType.ERROR:
            if "custom" in modes:
                events.append(("custom", {"type": frame.type, "data": frame.data}))
        elif frame.type == FrameType.WAIT:
            # The question the run waits for now ends the stream; one answered already
            # (a stream read again later, or the resumed run's) is passed over.
            _, interrupt = await asked_now(client, run_id, frame.data.get("wait_id"), attempt)
            if interrupt is not None:
                if "updates" in modes:
                    events.append(("updates", {"__interrupt__": interrupt}))
                if "values" in modes:
                    events.append(("values", {"text": transcript.text, "__interrupt__": interrupt}))
                if "custom" in modes:
                    events.append(("custom", {"type": frame.type, "data": frame.data}))
                for i, (name, data) in enumerate(events):
                    yield _event(name, data, frame.seq if i == len(events) - 1 else None)
                return
            if "custom" in modes:
                events.append(("custom", {"type": frame.type, "data": frame.data}))
        elif frame.type == FrameType.NODE and frame.data.get("action") == "completed":
            if "updates" in modes:
                run = await client.get(run_id)
                outputs = {
                    n.node_id: n.output for n in run.nodes if n.node_id == frame.data["node_id"]
                }
                events.append(("updates", outputs))
            if "custom" in modes:
                events.append(("custom", {"type": frame.type, "data": frame.data}))
        elif "custom" in modes:
            events.append(("custom", {"type": frame.type, "data": frame.data}))
        # Only the last event of a frame carries its id: a client that comes back with
        # it has every event of the frame.
        for i, (name, data) in enumerate(events):
            yield _event(name, data, frame.seq if i == len(events) - 1 else None)
        if frame.type == FrameType.DONE:
            return


def mount(
    app: FastAPI,
    client_of: ClientOf,
    threads: Threads,
    heartbeats: Callable[[AsyncIterator[bytes]], AsyncIterator[bytes]],
) -> None:
    """Add the LangGraph endpoints to the gateway."""

    @app.exception_handler(Refused)
    async def refused(request: Request, exc: Refused) -> Response:
        return JSONResponse({"detail": exc.detail}, exc.status)

    async def body(request: Request, model: type[BaseModel]) -> Any:
        raw = await request.body()
        return model.model_validate_json(raw or b"{}")

    async def thread_or_404(client: Client, thread_id: str) -> dict[str, Any] | None:
        if not THREAD_ID.match(thread_id):
            return None
        return await threads.get(client.tenant, thread_id)

    def thread_object(
        thread: dict[str, Any], status: str, values: Any, interrupts: Any = None
    ) -> dict[str, Any]:
        return {
            "thread_id": thread["thread_id"],
            "created_at": thread["created_at"],
            "updated_at": thread["updated_at"],
            "metadata": thread.get("metadata") or {},
            "status": status,
            "values": values,
            "interrupts": interrupts or {},
        }

    async def thread_state(client: Client, thread: dict[str, Any]) -> dict[str, Any]:
        """The thread as LangGraph's Thread: its status and values from its last run."""
        if not thread.get("last_run"):
            return thread_object(thread, "idle", None)
        try:
            run = await client.get(thread["last_run"])
        except ClientError:
            return thread_object(thread, "idle", None)
        interrupt = interrupt_of(run)
        if interrupt is not None:
            # Keyed by the run, which stands for LangGraph's task.
            return thread_object(thread, "interrupted", None, {run.run_id: interrupt})
        if not run.status.terminal:
            return thread_object(thread, "busy", None)
        status = "idle" if run.status == RunStatus.FINISHED else "error"
        return thread_object(thread, status, run.result)

    @app.post("/threads")
    async def create_thread(request: Request) -> Response:
        client = await client_of(request)
        try:
            given: ThreadBody = await body(request, ThreadBody)
        except ValidationError as exc:
            raise Refused(400, described(exc)) from exc
        thread_id = given.thread_id or str(uuid.uuid4())
        if not THREAD_ID.match(thread_id):
            raise Refused(400, THREAD_ID_RULE)
        thread, created = await threads.create(client.tenant, thread_id, given.metadata or {})
        if not created and (given.if_exists or "raise") == "raise":
            raise Refused(409, f"thread {thread_id} exists")
        return JSONResponse(await thread_state(client, thread))

    @app.get("/threads/{thread_id}")
    async def get_thread(thread_id: str, request: Request) -> Response:
        client = await client_of(request)
        thread = await thread_or_404(client, thread_id)
        if thread is None:
            raise Refused(404, f"no thread {thread_id}")
        return JSONResponse(await thread_state(client, thread))

    async def start(
        request: Request, thread_id: str | None
    ) -> tuple[Client, RunBody, RunSummary, int]:
        """Submit the run a request asks for, on its thread (created if asked), or resume
        the thread's interrupted run: (client, request, run, the seq its stream goes on
        after)."""
        client = await client_of(request)
        try:
            given: RunBody = await body(request, RunBody)
        except ValidationError as exc:
            raise Refused(400, described(exc)) from exc
        if given.command is not None and "resume" in given.command:
            if thread_id is None:
                raise Refused(400, "command: resume answers a thread's interrupt; name the thread")
            run, after = await resume(client, thread_id, given.command["resume"])
            return client, given, run, after
        strategy = STRATEGIES.get(given.multitask_strategy or "enqueue")
        if strategy is None:
            raise Refused(400, f"multitask_strategy: one of {', '.join(STRATEGIES)}")
        thread = None
        if thread_id is not None:
            thread = await thread_or_404(client, thread_id)
            if thread is None:
                if given.if_not_exists != "create":
                    raise Refused(
                        404, f"no thread {thread_id}; create it, or send if_not_exists: create"
                    )
                if not THREAD_ID.match(thread_id):
                    raise Refused(400, THREAD_ID_RULE)
                thread, _ = await threads.create(client.tenant, thread_id, {})
        try:
            cmd = SubmitCommand(
                request_id=str(uuid.uuid4()),
                runner=given.assistant_id,
                input=given.input or {},
                session_id=thread_id,
                multitask=strategy,
                metadata=given.metadata or {},
            )
        except ValidationError as exc:
            raise Refused(400, described(exc)) from exc
        try:
            reply = await client.submit_command(cmd)
        except ClientError as exc:
            raise Refused(status_of(exc.error), exc.message) from exc
        if thread is not None:
            await threads.ran(client.tenant, thread, reply.run.run_id)
        return client, given, reply.run, 0

    async def resume(client: Client, thread_id: str, value: Any) -> tuple[RunSummary, int]:
        """Answer the interrupt of the thread's last run: the run, and the seq of its
        question (its stream goes on after it)."""
        thread = await thread_or_404(client, thread_id)
        if thread is None:
            raise Refused(404, f"no thread {thread_id}")
        run = await client.get(thread["last_run"]) if thread.get("last_run") else None
        interrupt = interrupt_of(run) if run is not None else None
        if run is None or interrupt is None:
            raise Refused(409, f"thread {thread_id} is not interrupted: nothing to resume")
        try:
            await client.resume(run.run_id, value, wait_id=interrupt[0]["id"])
        except ClientError as exc:
            raise Refused(status_of(exc.error), exc.message) from exc
        return run, run.last_seq

    def locations(thread_id: str | None, run_id: str, tail: str) -> dict[str, str]:
        base = f"/threads/{thread_id}/runs/{run_id}" if thread_id else f"/runs/{run_id}"
        return {"Location": f"{base}{tail}", "Content-Location": base}

    def sse(events: AsyncIterator[bytes], headers: dict[str, str]) -> StreamingResponse:
        return StreamingResponse(
            heartbeats(events),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **headers},
        )

    async def create_run(request: Request, thread_id: str | None) -> Response:
        started = await start(request, thread_id)
        _, given, run, _ = started
        return JSONResponse(
            run_object(run, given.assistant_id, given.multitask_strategy),
            headers=locations(thread_id, run.run_id, ""),
        )

    async def stream_run(request: Request, thread_id: str | None) -> Response:
        started = await start(request, thread_id)
        client, given, run, after = started
        modes = _modes(given.stream_mode)
        events = stream_events(client, run.run_id, given.assistant_id, modes, after, metadata=True)
        return sse(events, locations(thread_id, run.run_id, "/stream"))

    async def wait_run(request: Request, thread_id: str | None) -> Response:
        started = await start(request, thread_id)
        client, _, run, after = started
        final = await ended_values(client, run.run_id, after)
        return JSONResponse(final, headers=locations(thread_id, run.run_id, "/join"))

    async def finished(client: Client, run_id: str, after: int = 0) -> RunSummary:
        """The run once it ended, or stopped at the question of an interrupt."""
        run, _ = await stopped(client, run_id, after)
        return run

    async def stopped(client: Client, run_id: str, after: int) -> tuple[RunSummary, str]:
        """The run once it ended or stopped at an interrupt it waits for (one met after
        `after`), and its text."""
        transcript = Transcript()
        attempt: int | None = None
        async for frame in client.stream(run_id):
            transcript.apply(frame)
            if frame.type == FrameType.RUN:
                attempt = frame.data.get("attempt")
            elif frame.type == FrameType.DONE:
                break
            elif frame.type == FrameType.WAIT and frame.seq > after:
                wait_id = frame.data.get("wait_id")
                run, interrupt = await asked_now(client, run_id, wait_id, attempt)
                if interrupt is not None:
                    return run, transcript.text
        return await client.get(run_id), transcript.text

    async def ended_values(client: Client, run_id: str, after: int = 0) -> dict[str, Any]:
        run, text = await stopped(client, run_id, after)
        return final_values(run, text)

    @app.post("/threads/{thread_id}/runs")
    async def thread_run(thread_id: str, request: Request) -> Response:
        return await create_run(request, thread_id)

    @app.post("/threads/{thread_id}/runs/stream")
    async def thread_stream(thread_id: str, request: Request) -> Response:
        return await stream_run(request, thread_id)

    @app.post("/threads/{thread_id}/runs/wait")
    async def thread_wait(thread_id: str, request: Request) -> Response:
        return await wait_run(request, thread_id)

    @app.post("/runs/stream")
    async def stateless_stream(request: Request) -> Response:
        return await stream_run(request, None)

    @app.post("/runs/wait")
    async def stateless_wait(request: Request) -> Response:
        return await wait_run(request, None)

    async def thread_run_of(
        request: Request, thread_id: str, run_id: str
    ) -> tuple[Client, RunSummary]:
        client = await client_of(request)
        try:
            run = await client.get(run_id)
        except ClientError as exc:
            if exc.code == ErrorCode.NOT_FOUND:
                raise Refused(404, f"no run {run_id} in thread {thread_id}") from exc
            raise
        if run.session_id != thread_id:
            raise Refused(404, f"no run {run_id} in thread {thread_id}")
        return client, run

    @app.get("/threads/{thread_id}/runs/{run_id}")
    async def get_run(thread_id: str, run_id: str, request: Request) -> Response:
        found = await thread_run_of(request, thread_id, run_id)
        _, run = found
        return JSONResponse(run_object(run, None, None))

    @app.get("/threads/{thread_id}/runs/{run_id}/stream")
    async def join_stream(thread_id: str, run_id: str, request: Request) -> Response:
        found = await thread_run_of(request, thread_id, run_id)
        client, _ = found
        given = request.headers.get("last-event-id") or "0"
        try:
            after = max(0, int(given))
        except ValueError:
            raise Refused(400, f"Last-Event-ID: a seq, not {given[:40]!r}") from None
        raw_modes = request.query_params.getlist("stream_mode")
        modes = _modes(raw_modes[0] if len(raw_modes) == 1 else (raw_modes or None))
        # (The run's summary does not name its runner: updates of a rejoined stream are
        # under "agent".)
        events = stream_events(client, run_id, "agent", modes, after)
        return sse(events, locations(thread_id, run_id, "/stream"))

    @app.post("/threads/{thread_id}/runs/{run_id}/cancel")
    async def cancel_run(thread_id: str, run_id: str, request: Request) -> Response:
        found = await thread_run_of(request, thread_id, run_id)
        client, _ = found
        await client.cancel(run_id)
        if request.query_params.get("wait") in ("1", "true"):
            final = await finished(client, run_id)
            return JSONResponse(run_object(final, None, None))
        return Response(status_code=202)

    @app.get("/threads/{thread_id}/runs/{run_id}/join")
    async def join_run(thread_id: str, run_id: str, request: Request) -> Response:
        found = await thread_run_of(request, thread_id, run_id)
        client, _ = found
        return JSONResponse(await ended_values(client, run_id))
