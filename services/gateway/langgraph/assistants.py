"""LangGraph assistants: one per runner the submitter accepts, named by the runner or by
the UUID LangGraph's server gives a graph of that name; search, get, graph and schemas
as the SDK's `assistants` calls read them."""

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from runwire.client.sdk import Client
from runwire.gateway.errors import described
from runwire.gateway.langgraph.refused import Refused
from runwire.gateway.langgraph.values import assistant_id

# How long the list of runners is believed before the submitter is asked again.
RUNNERS_FRESH_S = 5.0
# When the assistants were made (runners have no creation time of their own).
SINCE = datetime(2025, 1, 1, tzinfo=UTC).isoformat()


class Assistants:
    """The runners the submitter accepts, asked again every RUNNERS_FRESH_S."""

    def __init__(self) -> None:
        self._runners: list[str] = []
        self._asked_at = float("-inf")

    async def runners(self, client: Client) -> list[str]:
        now = asyncio.get_running_loop().time()
        if now - self._asked_at > RUNNERS_FRESH_S or not self._runners:
            replies = await client.health("submitter", enough=lambda r: r.ok)
            found = sorted({name for reply in replies for name in reply.runners})
            if found:
                self._runners, self._asked_at = found, now
        return self._runners

    async def runner(self, client: Client, given: str) -> str:
        """The runner an assistant id names: 422 for an unknown name, 404 for an unknown
        UUID, as LangGraph's server answers for graphs."""
        runners = await self.runners(client)
        if given in runners:
            return given
        by_id = {assistant_id(name): name for name in runners}
        if given in by_id:
            return by_id[given]
        try:
            uuid.UUID(given)
        except ValueError:
            raise Refused(
                422,
                f"Invalid assistant: '{given}'. Must be either:\n- A valid assistant UUID, "
                f"or\n- One of the registered graphs: {', '.join(runners)}",
            ) from None
        raise Refused(404, "Thread or assistant not found.")


class SearchBody(BaseModel):
    """An assistants search, validated as LangGraph's server validates it."""

    model_config = ConfigDict(extra="allow")

    metadata: dict[str, Any] | None = None
    graph_id: str | None = None
    name: str | None = None
    limit: int = Field(default=10, ge=1, le=1000, strict=True)
    offset: int = Field(default=0, ge=0, strict=True)
    sort_by: Literal["assistant_id", "created_at", "updated_at", "name", "graph_id"] | None = None
    sort_order: Literal["asc", "desc"] | None = None
    select: (
        list[
            Literal[
                "assistant_id",
                "graph_id",
                "name",
                "description",
                "config",
                "context",
                "created_at",
                "updated_at",
                "metadata",
                "version",
            ]
        ]
        | None
    ) = None


def assistant(runner: str) -> dict[str, Any]:
    """A runner as LangGraph's Assistant."""
    return {
        "assistant_id": assistant_id(runner),
        "graph_id": runner,
        "config": {},
        "context": {},
        "metadata": {"created_by": "system"},
        "name": runner,
        "created_at": SINCE,
        "updated_at": SINCE,
        "version": 1,
        "description": None,
    }


def mount_assistants(
    app: FastAPI, client_of: Callable[[Request], Awaitable[Client]], assistants: Assistants
) -> None:
    """The assistants endpoints."""

    @app.post("/assistants/search")
    async def search(request: Request) -> Response:
        client = await client_of(request)
        try:
            given = SearchBody.model_validate_json(await request.body() or b"{}")
        except ValidationError as exc:
            if any(e["type"] == "json_invalid" for e in exc.errors()):
                raise Refused(422, "Invalid JSON in request body") from exc
            raise Refused(422, described(exc)) from exc
        found = [
            assistant(name)
            for name in await assistants.runners(client)
            if given.graph_id in (None, name) and given.name in (None, name)
        ]
        found = [
            a
            for a in found
            if all(a["metadata"].get(k) == v for k, v in (given.metadata or {}).items())
        ]
        if given.sort_by is not None:
            by = given.sort_by
            found.sort(key=lambda a: str(a[by]), reverse=given.sort_order == "desc")
        page = found[given.offset : given.offset + given.limit]
        if given.select:
            page = [{k: a.get(k) for k in given.select} for a in page]
        return JSONResponse(page)

    @app.get("/assistants/{given}")
    async def get(given: str, request: Request) -> Response:
        client = await client_of(request)
        return JSONResponse(assistant(await assistants.runner(client, given)))

    @app.get("/assistants/{given}/graph")
    async def graph(given: str, request: Request) -> Response:
        client = await client_of(request)
        runner = await assistants.runner(client, given)
        nodes = [
            {"id": "__start__", "type": "schema", "data": "__start__"},
            {"id": runner, "type": "runnable", "data": {"id": ["runwire", runner], "name": runner}},
            {"id": "__end__", "type": "schema", "data": "__end__"},
        ]
        edges = [
            {"source": "__start__", "target": runner},
            {"source": runner, "target": "__end__"},
        ]
        return JSONResponse({"nodes": nodes, "edges": edges})
