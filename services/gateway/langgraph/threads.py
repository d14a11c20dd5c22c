"""The LangGraph thread endpoints: create, get, update, delete, search, state and
history (runwire keeps no checkpoint of each step: the history is the state now)."""

import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

import runwire.gateway.langgraph.state as lgthreads
from runwire.client.sdk import Client
from runwire.gateway.langgraph.refused import Refused, one_of
from runwire.gateway.threads import Threads, valid_thread_id

ClientOf = Callable[[Request], Awaitable[Client]]


class ThreadBody(BaseModel):
    model_config = ConfigDict(extra="allow")

    thread_id: str | None = None
    metadata: dict[str, Any] | None = None
    if_exists: str | None = None


class SearchBody(BaseModel):
    """A thread search, validated as LangGraph's server validates it."""

    model_config = ConfigDict(extra="allow")

    ids: list[str] | None = None
    metadata: dict[str, Any] | None = None
    values: dict[str, Any] | None = None
    status: Literal["idle", "busy", "interrupted", "error"] | None = None
    limit: int = Field(default=10, ge=1, le=1000, strict=True)
    offset: int = Field(default=0, ge=0, strict=True)
    sort_by: (
        Literal["thread_id", "status", "created_at", "updated_at", "state_updated_at"] | None
    ) = None
    sort_order: Literal["asc", "desc"] | None = None
    select: (
        list[
            Literal[
                "thread_id",
                "created_at",
                "updated_at",
                "state_updated_at",
                "metadata",
                "config",
                "status",
                "values",
                "interrupts",
            ]
        ]
        | None
    ) = None


def thread_object(thread: dict[str, Any], view: lgthreads.View) -> dict[str, Any]:
    """The thread as LangGraph's Thread (one that never ran has no error or interrupts)."""
    never_ran = not thread.get("runs") and not thread.get("ended") and view.values is None
    shown = {
        "thread_id": thread["thread_id"],
        "created_at": thread["created_at"],
        "updated_at": thread["updated_at"],
        "state_updated_at": thread["updated_at"],
        "metadata": thread.get("metadata") or {},
        "status": view.status,
        "config": {},
        "values": view.values,
        "error": view.error,
        "interrupts": view.interrupts,
    }
    if never_ran:
        del shown["error"], shown["interrupts"]
    return shown


def mount_threads(
    app: FastAPI,
    client_of: ClientOf,
    threads: Threads,
    thread_or_404: Callable[[Client, str], Awaitable[dict[str, Any]]],
    shown: Callable[[Client, dict[str, Any]], Awaitable[dict[str, Any]]],
    body: Callable[[Request, type[BaseModel]], Awaitable[Any]],
) -> None:
    """Threads: create, get, update, delete, search, state and history."""

    @app.post("/threads")
    async def create_thread(request: Request) -> Response:
        client = await client_of(request)
        given: ThreadBody = await body(request, ThreadBody)
        one_of("if_exists", given.if_exists, ["raise", "do_nothing"])
        thread_id = given.thread_id or str(uuid.uuid4())
        if not valid_thread_id(thread_id):
            raise Refused(422, "Invalid thread ID")
        thread, created = await threads.create(client.tenant, thread_id, given.metadata or {})
        if not created and (given.if_exists or "raise") == "raise":
            raise Refused(409, f"Thread {thread_id} already exists")
        return JSONResponse(await shown(client, thread))

    @app.get("/threads/{thread_id}")
    async def get_thread(thread_id: str, request: Request) -> Response:
        client = await client_of(request)
        return JSONResponse(await shown(client, await thread_or_404(client, thread_id)))

    @app.patch("/threads/{thread_id}")
    async def update_thread(thread_id: str, request: Request) -> Response:
        client = await client_of(request)
        await thread_or_404(client, thread_id)
        given: ThreadBody = await body(request, ThreadBody)
        changed = await threads.change(
            client.tenant,
            thread_id,
            lambda now: {**now, "metadata": {**now.get("metadata", {}), **(given.metadata or {})}},
        )
        if changed is None:
            raise Refused(404, f"Thread with ID {thread_id} not found")
        return JSONResponse(await shown(client, changed))

    @app.delete("/threads/{thread_id}")
    async def delete_thread(thread_id: str, request: Request) -> Response:
        client = await client_of(request)
        await thread_or_404(client, thread_id)
        await threads.delete(client.tenant, thread_id)
        return Response(status_code=204)

    @app.post("/threads/search")
    async def search_threads(request: Request) -> Response:
        client = await client_of(request)
        given: SearchBody = await body(request, SearchBody)
        every = await threads.all(client.tenant)
        if given.ids is not None:
            every = [t for t in every if t["thread_id"] in given.ids]
        metadata = given.metadata or {}
        every = [
            t for t in every if all(t.get("metadata", {}).get(k) == v for k, v in metadata.items())
        ]
        by = given.sort_by or "updated_at"
        if by == "state_updated_at":
            by = "updated_at"
        descending = (given.sort_order or "desc") == "desc"
        # What a thread shows is asked only of those the page needs, but for an order by
        # its status.
        whole = by == "status"
        if by != "status":
            every.sort(key=lambda t: str(t.get(by, "")), reverse=descending)
        found = []
        for thread in every:
            shown_thread = await shown(client, thread)
            if given.status is not None and shown_thread["status"] != given.status:
                continue
            values = shown_thread.get("values") or {}
            if any(values.get(k) != v for k, v in (given.values or {}).items()):
                continue
            found.append(shown_thread)
            if not whole and len(found) >= given.offset + given.limit:
                break
        if by == "status":
            found.sort(key=lambda t: str(t["status"]), reverse=descending)
        page = found[given.offset : given.offset + given.limit]
        if given.select:
            page = [{k: t.get(k) for k in given.select} for t in page]
        return JSONResponse(page)

    async def state_of(client: Client, thread_id: str) -> dict[str, Any]:
        thread = await thread_or_404(client, thread_id)
        view, thread = await lgthreads.view_of(client, threads, thread)
        tasks = []
        if view.waiting is not None:
            run = view.waiting
            told = lgthreads.known(thread, run.run_id)
            tasks.append(
                {
                    "id": lgthreads.task_id(run),
                    "name": told.get("assistant", "agent"),
                    "path": ["__pregel_pull", told.get("assistant", "agent")],
                    "error": None,
                    "interrupts": view.interrupts[lgthreads.task_id(run)],
                    "checkpoint": None,
                    "state": None,
                    "result": None,
                }
            )
        return {
            "values": view.values or {},
            "next": [t["name"] for t in tasks],
            "tasks": tasks,
            "metadata": thread.get("metadata") or {},
            "created_at": thread["updated_at"],
            "checkpoint": {"checkpoint_id": None, "thread_id": thread_id, "checkpoint_ns": ""},
            "parent_checkpoint": None,
            "interrupts": [q for t in tasks for q in t["interrupts"]],
            "checkpoint_id": None,
            "parent_checkpoint_id": None,
        }

    @app.get("/threads/{thread_id}/state")
    async def get_state(thread_id: str, request: Request) -> Response:
        client = await client_of(request)
        return JSONResponse(await state_of(client, thread_id))

    async def history(thread_id: str, request: Request) -> Response:
        """The thread's state now (runwire keeps no checkpoint of each step)."""
        client = await client_of(request)
        return JSONResponse([await state_of(client, thread_id)])

    app.get("/threads/{thread_id}/history")(history)
    app.post("/threads/{thread_id}/history")(history)
