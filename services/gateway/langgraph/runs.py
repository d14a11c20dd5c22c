"""The LangGraph run endpoints (create, stream, wait, join, list, get, delete,
cancel), the interrupt's resume and the multitask strategies; see the package's note."""

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from functools import partial
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

import runwire.gateway.langgraph.state as lgthreads
import runwire.gateway.langgraph.values as lgvalues
from runwire.client.sdk import Client, ClientError
from runwire.contracts.commands import Multitask, SubmitCommand
from runwire.contracts.errors import ErrorCode
from runwire.contracts.frames import FrameType, Transcript
from runwire.contracts.replies import RunSummary
from runwire.contracts.status import RunStatus
from runwire.gateway.errors import described, status_of
from runwire.gateway.langgraph.assistants import Assistants, mount_assistants
from runwire.gateway.langgraph.refused import Refused, one_of
from runwire.gateway.langgraph.stream import asked_now, error_of, interrupt_of, stream_events
from runwire.gateway.langgraph.threads import mount_threads, thread_object
from runwire.gateway.threads import Threads, valid_thread_id

ClientOf = Callable[[Request], Awaitable[Client]]

STRATEGIES = {
    "reject": Multitask.REJECT,
    "interrupt": Multitask.INTERRUPT,
    "rollback": Multitask.INTERRUPT,
    "enqueue": Multitask.ENQUEUE,
}
# The stream modes served (docs/langgraph-sdk.md); LangGraph's others are refused.
MODES = {"values", "updates", "messages", "messages-tuple", "custom", "events"}
OTHER_MODES = {"debug", "tasks", "checkpoints"}
DEFAULT_MODES = ["values"]
log = logging.getLogger(__name__)
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
NO_THREAD = "Thread or assistant not found."


class RunBody(BaseModel):
    """A run request: what runwire acts on; the other fields the SDK may send are
    accepted and ignored (see docs/langgraph-sdk.md's list)."""

    model_config = ConfigDict(extra="allow")

    assistant_id: str = Field(min_length=1, max_length=128)
    input: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    multitask_strategy: str | None = None
    if_not_exists: str | None = None
    stream_mode: list[str] | str | None = None
    on_disconnect: str | None = None
    # `{"resume": value}`: the answer to the thread's interrupt (see the module).
    command: dict[str, Any] | None = None


async def as_given(value: dict[str, Any] | None) -> dict[str, Any]:
    return value or {}


def modes_of(given: list[str] | str | None) -> list[str]:
    """The stream modes asked for; 422 for one LangGraph does not know or runwire does
    not serve."""
    if given is None or given == "" or given == []:
        return list(DEFAULT_MODES)
    if isinstance(given, str):
        try:
            parsed = json.loads(given)
        except ValueError:
            parsed = given
        given = parsed if isinstance(parsed, list) else [given]
    for mode in given:
        if mode in OTHER_MODES:
            raise Refused(422, f"stream_mode {mode!r} is not served by runwire")
        if mode not in MODES:
            raise Refused(422, f"stream_mode: {mode!r} is not one of {', '.join(sorted(MODES))}")
    return list(given)


def count_of(request: Request, name: str, default: int) -> int:
    """A query parameter that counts (a limit, an offset): 400 unless an integer, as
    LangGraph's server answers."""
    given = request.query_params.get(name)
    if given is None or given == "":
        return default
    try:
        return int(given)
    except ValueError:
        raise Refused(400, f"{name}: an integer, not {given[:40]!r}") from None


async def until_left(
    body: AsyncIterator[bytes], on_leave: Callable[[], Coroutine[Any, Any, None]]
) -> AsyncIterator[bytes]:
    """`body`, and `on_leave` started (not awaited: the stream is being torn down) when
    the client goes before `body` ends."""
    ended = False
    try:
        async for chunk in body:
            yield chunk
        ended = True
    finally:
        if not ended:
            task = asyncio.get_running_loop().create_task(on_leave())
            LEAVING.add(task)
            task.add_done_callback(LEAVING.discard)


# The cancels of runs whose clients left, kept until done (the loop holds tasks weakly).
LEAVING: set[asyncio.Task[None]] = set()


async def cancel_quietly(client: Client, run_id: str) -> None:
    """Cancel a run whose client left (one that ended meanwhile stays as it ended)."""
    try:
        await client.cancel(run_id)
    except ClientError as exc:
        if exc.code != ErrorCode.NOT_FOUND:
            log.warning(
                "could not cancel the run its client left",
                extra={"run_id": run_id, "code": exc.code},
            )


def run_object(
    run: RunSummary, thread: dict[str, Any] | None, fallback: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A runwire run as the LangGraph API's Run."""
    status = RUN_STATUS[run.status]
    if run.status == RunStatus.FAILED and run.error is not None and run.error.code in TIMEOUT_CODES:
        status = "timeout"
    told = (lgthreads.known(thread, run.run_id) if thread else {}) or fallback or {}
    # A run the thread's session got through runwire's own API is its runner's.
    assistant = told.get("assistant") or run.runner or ""
    return {
        "run_id": run.run_id,
        "thread_id": run.session_id,
        "assistant_id": lgvalues.assistant_id(assistant) if assistant else "",
        "created_at": run.created_at.isoformat(),
        "updated_at": run.updated_at.isoformat(),
        "status": status,
        "metadata": told.get("metadata", {}),
        "multitask_strategy": told.get("strategy") or "enqueue",
        "kwargs": {},
    }


def mount(
    app: FastAPI,
    client_of: ClientOf,
    threads: Threads,
    heartbeats: Callable[[AsyncIterator[bytes]], AsyncIterator[bytes]],
) -> None:
    """Add the LangGraph endpoints to the gateway."""
    assistants = Assistants()

    @app.exception_handler(Refused)
    async def refused(request: Request, exc: Refused) -> Response:
        return JSONResponse({"detail": exc.detail}, exc.status)

    async def body(request: Request, model: type[BaseModel]) -> Any:
        raw = await request.body()
        try:
            return model.model_validate_json(raw or b"{}")
        except ValidationError as exc:
            if any(e["type"] == "json_invalid" for e in exc.errors()):
                raise Refused(422, "Invalid JSON in request body") from exc
            raise Refused(422, described(exc)) from exc

    async def thread_or_404(client: Client, thread_id: str) -> dict[str, Any]:
        if not valid_thread_id(thread_id):
            raise Refused(422, "Invalid thread ID")
        thread = await threads.get(client.tenant, thread_id)
        if thread is None:
            raise Refused(404, f"Thread with ID {thread_id} not found")
        return thread

    async def shown(client: Client, thread: dict[str, Any]) -> dict[str, Any]:
        view, thread = await lgthreads.view_of(client, threads, thread)
        return thread_object(thread, view)

    mount_threads(app, client_of, threads, thread_or_404, shown, body)
    mount_assistants(app, client_of, assistants)

    async def start(
        request: Request, thread_id: str | None
    ) -> tuple[Client, RunBody, RunSummary, int, dict[str, Any] | None]:
        """Submit the run a request asks for, on its thread (created if asked), or resume
        the thread's interrupted run: (client, request, run, the seq its stream goes on
        after, the stateless run's record)."""
        client = await client_of(request)
        given: RunBody = await body(request, RunBody)
        one_of("multitask_strategy", given.multitask_strategy, list(STRATEGIES))
        one_of("if_not_exists", given.if_not_exists, ["create", "reject"])
        one_of("on_disconnect", given.on_disconnect, ["cancel", "continue"])
        modes_of(given.stream_mode)
        runner = await assistants.runner(client, given.assistant_id)
        if given.command is not None and "resume" in given.command:
            if thread_id is None:
                raise Refused(422, "command: resume answers a thread's interrupt; name the thread")
            run, after = await resume(client, thread_id, given.command["resume"])
            return client, given, run, after, None
        strategy = given.multitask_strategy or "enqueue"
        thread = None
        if thread_id is not None:
            if not valid_thread_id(thread_id):
                raise Refused(422, "Invalid thread ID")
            thread = await threads.get(client.tenant, thread_id)
            if thread is None:
                if given.if_not_exists != "create":
                    raise Refused(404, NO_THREAD)
                thread, _ = await threads.create(client.tenant, thread_id, {})
        try:
            record = lgthreads.entry("", runner, given.input, given.metadata or {})
        except ValueError as exc:
            raise Refused(422, f"input: {exc}") from exc
        metadata = {
            **(thread or {}).get("metadata", {}),
            **(given.metadata or {}),
            "graph_id": runner,
            "assistant_id": lgvalues.assistant_id(runner),
        }
        if strategy == "rollback" and thread is not None:
            await rollback_active(client, thread)
        try:
            cmd = SubmitCommand(
                request_id=str(uuid.uuid4()),
                runner=runner,
                input=given.input or {},
                session_id=thread_id,
                multitask=STRATEGIES[strategy],
                metadata=metadata,
            )
        except ValidationError as exc:
            raise Refused(422, described(exc)) from exc
        try:
            reply = await client.submit_command(cmd)
        except ClientError as exc:
            if exc.code == ErrorCode.SESSION_BUSY:
                raise Refused(
                    409,
                    "Thread is already running a task. Wait for it to finish or choose a "
                    "different multitask strategy.",
                ) from exc
            raise Refused(status_of(exc.error), exc.message) from exc
        record.update(run_id=reply.run.run_id, metadata=metadata)
        record["modes"] = modes_of(given.stream_mode)
        if thread_id is not None:
            await threads.change(
                client.tenant, thread_id, lambda now: lgthreads.ran(now, record, strategy)
            )
            return client, given, reply.run, 0, None
        return client, given, reply.run, 0, {**record, "strategy": strategy}

    async def rollback_active(client: Client, thread: dict[str, Any]) -> None:
        """Delete the thread's runs that have not ended (a rollback)."""
        active = set()
        for run_entry in thread.get("runs", []):
            try:
                run = await client.get(run_entry["run_id"])
            except ClientError:
                continue
            if not run.status.terminal:
                active.add(run.run_id)
        if active:
            await threads.change(
                client.tenant, thread["thread_id"], lambda now: lgthreads.rolled_back(now, active)
            )

    async def resume(client: Client, thread_id: str, value: Any) -> tuple[RunSummary, int]:
        """Answer the interrupt of the thread's waiting run: the run, and the seq of its
        question (its stream goes on after it)."""
        thread = await thread_or_404(client, thread_id)
        view, _ = await lgthreads.view_of(client, threads, thread)
        run = view.waiting
        if run is None:
            raise Refused(409, f"thread {thread_id} is not interrupted: nothing to resume")
        interrupt = interrupt_of(run)
        try:
            wait_id = interrupt[0]["id"] if interrupt else None
            await client.resume(run.run_id, value, wait_id=wait_id)
        except ClientError as exc:
            raise Refused(status_of(exc.error), exc.message) from exc
        return run, run.last_seq

    def locations(thread_id: str | None, run_id: str, tail: str) -> dict[str, str]:
        base = f"/threads/{thread_id}/runs/{run_id}" if thread_id else f"/runs/{run_id}"
        return {"Location": f"{base}{tail}", "Content-Location": base}

    def sse(
        events: AsyncIterator[bytes],
        headers: dict[str, str],
        on_leave: Callable[[], Coroutine[Any, Any, None]] | None = None,
    ) -> StreamingResponse:
        body = heartbeats(events)
        return StreamingResponse(
            body if on_leave is None else until_left(body, on_leave),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **headers},
        )

    def start_values(
        client: Client, thread_id: str | None, run_id: str, record: dict[str, Any] | None
    ) -> Callable[[], Awaitable[dict[str, Any]]]:
        """The values as the run starts (asked once, when its first attempt starts)."""
        cached: list[dict[str, Any]] = []

        async def values() -> dict[str, Any]:
            if not cached:
                if thread_id is None:
                    cached.append(lgvalues.applied(None, record or {}))
                else:
                    cached.append(
                        await lgthreads.values_before(
                            client, threads, client.tenant, thread_id, run_id
                        )
                    )
            return cached[0]

        return values

    async def create_run(request: Request, thread_id: str | None) -> Response:
        client, _, run, _, record = await start(request, thread_id)
        thread = await threads.get(client.tenant, thread_id) if thread_id else None
        return JSONResponse(
            run_object(run, thread, record), headers=locations(thread_id, run.run_id, "")
        )

    async def stream_run(request: Request, thread_id: str | None) -> Response:
        client, given, run, after, record = await start(request, thread_id)
        runner = await assistants.runner(client, given.assistant_id)
        events = stream_events(
            client,
            run.run_id,
            runner,
            modes_of(given.stream_mode),
            after,
            start_values(client, thread_id, run.run_id, record),
            given=lambda: as_given(given.input),
            thread_id=thread_id,
            metadata=True,
        )
        on_leave = None
        if given.on_disconnect == "cancel":
            # As LangGraph's server: the client that leaves before the run ends stops it.
            on_leave = partial(cancel_quietly, client, run.run_id)
        return sse(events, locations(thread_id, run.run_id, "/stream"), on_leave)

    async def wait_run(request: Request, thread_id: str | None) -> Response:
        client, _, run, after, record = await start(request, thread_id)
        final = await ended_values(
            client, run.run_id, after, start_values(client, thread_id, run.run_id, record)
        )
        return JSONResponse(final, headers=locations(thread_id, run.run_id, "/join"))

    async def ended_values(
        client: Client, run_id: str, after: int, values: Callable[[], Awaitable[dict[str, Any]]]
    ) -> dict[str, Any]:
        """What `runs.wait` and `runs.join` answer: the values once the run ended (or
        stopped at an interrupt it waits for, one met after `after`), or `__error__`."""
        transcript = Transcript()
        attempt: int | None = None
        async for frame in client.stream(run_id):
            transcript.apply(frame)
            if frame.type == FrameType.RUN:
                attempt = frame.data.get("attempt")
            elif frame.type == FrameType.DONE:
                break
            elif frame.type == FrameType.WAIT and frame.seq > after:
                _, interrupt = await asked_now(client, run_id, frame.data.get("wait_id"), attempt)
                if interrupt is not None:
                    return {"__interrupt__": interrupt}
        run = await client.get(run_id)
        if run.status == RunStatus.FINISHED:
            return lgvalues.answered(await values(), run_id, transcript.text)
        return {"__error__": error_of(run)}

    for stateless in (False, True):
        prefix = "" if stateless else "/threads/{thread_id}"

        def bind(handler: Callable[[Request, str | None], Awaitable[Response]], free: bool) -> Any:
            if free:

                async def route_free(request: Request) -> Response:
                    return await handler(request, None)

                return route_free

            async def route(thread_id: str, request: Request) -> Response:
                return await handler(request, thread_id)

            return route

        app.post(f"{prefix}/runs")(bind(create_run, stateless))
        app.post(f"{prefix}/runs/stream")(bind(stream_run, stateless))
        app.post(f"{prefix}/runs/wait")(bind(wait_run, stateless))

    async def thread_run_of(
        request: Request, thread_id: str, run_id: str
    ) -> tuple[Client, RunSummary, dict[str, Any]]:
        client = await client_of(request)
        thread = await thread_or_404(client, thread_id)
        if run_id in thread.get("deleted", []):
            raise Refused(404, "Not Found")
        try:
            run = await client.get(run_id)
        except ClientError as exc:
            if exc.code == ErrorCode.NOT_FOUND:
                raise Refused(404, "Not Found") from exc
            raise
        if run.session_id != thread_id:
            raise Refused(404, "Not Found")
        return client, run, thread

    @app.get("/threads/{thread_id}/runs")
    async def list_runs(thread_id: str, request: Request) -> Response:
        client = await client_of(request)
        thread = await thread_or_404(client, thread_id)
        limit = count_of(request, "limit", 10)
        offset = count_of(request, "offset", 0)
        # An unknown status, or a limit or offset below 0, finds nothing (as the server).
        wanted = request.query_params.get("status")
        if limit <= 0 or offset < 0:
            return JSONResponse([])
        found: list[dict[str, Any]] = []
        before = None
        while len(found) < offset + limit:
            page = await client.list_runs(session_id=thread_id, limit=100, before=before)
            for run in page.runs:
                shown_run = run_object(run, thread)
                if run.run_id in thread.get("deleted", []):
                    continue
                if wanted is None or shown_run["status"] == wanted:
                    found.append(shown_run)
            if page.next is None:
                break
            before = page.next
        return JSONResponse(found[offset : offset + limit])

    @app.get("/threads/{thread_id}/runs/{run_id}")
    async def get_run(thread_id: str, run_id: str, request: Request) -> Response:
        _, run, thread = await thread_run_of(request, thread_id, run_id)
        return JSONResponse(run_object(run, thread))

    @app.delete("/threads/{thread_id}/runs/{run_id}")
    async def delete_run(thread_id: str, run_id: str, request: Request) -> Response:
        client, run, _ = await thread_run_of(request, thread_id, run_id)
        if not run.status.terminal:
            raise Refused(409, "Cannot delete a run that is pending or running")
        await threads.change(
            client.tenant, thread_id, lambda now: lgthreads.rolled_back(now, {run_id})
        )
        return Response(status_code=204)

    @app.get("/threads/{thread_id}/runs/{run_id}/stream")
    async def join_stream(thread_id: str, run_id: str, request: Request) -> Response:
        client, _, thread = await thread_run_of(request, thread_id, run_id)
        given = request.headers.get("last-event-id") or "0"
        try:
            after = max(0, int(given))
        except ValueError:
            raise Refused(422, f"Last-Event-ID: a seq, not {given[:40]!r}") from None
        told = lgthreads.known(thread, run_id)
        # The modes asked for, else those the run was created with.
        raw_modes = [m for m in request.query_params.getlist("stream_mode") if m]
        asked = raw_modes[0] if len(raw_modes) == 1 else (raw_modes or told.get("modes"))
        modes = modes_of(asked)
        runner = told.get("assistant", "agent")
        values = start_values(client, thread_id, run_id, None)
        events = stream_events(client, run_id, runner, modes, after, values, thread_id=thread_id)
        on_leave = None
        leaving = request.query_params.get("cancel_on_disconnect", "false").lower()
        if leaving in {"true", "yes", "1"}:
            on_leave = partial(cancel_quietly, client, run_id)
        return sse(events, locations(thread_id, run_id, "/stream"), on_leave)

    @app.post("/threads/{thread_id}/runs/{run_id}/cancel")
    async def cancel_run(thread_id: str, run_id: str, request: Request) -> Response:
        client, run, _ = await thread_run_of(request, thread_id, run_id)
        action = request.query_params.get("action") or "interrupt"
        one_of("action", action, ["interrupt", "rollback"])
        if run.status.terminal or run.status == RunStatus.WAITING:
            raise Refused(
                404,
                "No matching runs to cancel. Please verify the thread ID and run IDs are "
                "correct, and the runs haven't been deleted or completed.",
            )
        await client.cancel(run_id)
        if action == "rollback":
            await threads.change(
                client.tenant, thread_id, lambda now: lgthreads.rolled_back(now, {run_id})
            )
        if request.query_params.get("wait") in ("1", "true"):
            async for frame in client.stream(run_id):
                if frame.type == FrameType.DONE:
                    break
            return JSONResponse({})
        return Response(status_code=202)

    @app.get("/threads/{thread_id}/runs/{run_id}/join")
    async def join_run(thread_id: str, run_id: str, request: Request) -> Response:
        client, _, _ = await thread_run_of(request, thread_id, run_id)
        values = start_values(client, thread_id, run_id, None)
        return JSONResponse(await ended_values(client, run_id, 0, values))
