"""runwire's own HTTP API: one endpoint per command, a run's frames as Server-Sent Events.

Every request names its tenant by its API key (`Authorization: Bearer <key>` or
`x-api-key`); the gateway acts for that tenant through the SDK, so a key of one tenant
never reaches another's runs (they are NOT_FOUND to it). Errors are the wire's
`{ok: false, error: {code, message, retryable}}` with a fitting HTTP status.
"""

import asyncio
import contextlib
import functools
import json
import logging
import re
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from runwire.client.sdk import Client, ClientError
from runwire.contracts.commands import (
    MAX_SEQ,
    ListCommand,
    RescheduleCommand,
    ResumeCommand,
    SetWebhooksCommand,
    SignalCommand,
    SubmitCommand,
)
from runwire.contracts.errors import ErrorBody, ErrorCode, ErrorReply
from runwire.contracts.frames import Frame, FrameType
from runwire.contracts.replies import AbortSessionReply, ResumeReply, RunReply, SignalReply
from runwire.contracts.subjects import SIGNAL_NAME_PATTERN
from runwire.gateway import console, langgraph
from runwire.gateway.errors import described, status_of
from runwire.gateway.keys import ApiKeys
from runwire.gateway.limits import Limits
from runwire.gateway.settings import GatewaySettings
from runwire.gateway.signals import signal_token, token_fits
from runwire.gateway.threads import Threads

log = logging.getLogger(__name__)

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# How long a run's shared feed outlives its last reader (a client that comes back soon
# finds it).
FEED_IDLE_S = 5.0


def error_response(code: ErrorCode, message: str, *, retryable: bool = False) -> JSONResponse:
    body = ErrorBody(code=code, message=message, retryable=retryable)
    return JSONResponse(ErrorReply(error=body).model_dump(mode="json"), status_of(body))


class Tenants:
    """One SDK client per tenant, connected when its first request comes."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self._clients: dict[str, Client] = {}
        self._lock = asyncio.Lock()

    async def client(self, tenant: str) -> Client:
        found = self._clients.get(tenant)
        if found is not None:
            return found
        async with self._lock:
            if tenant not in self._clients:
                password = self.settings.nats_password
                self._clients[tenant] = await Client.connect(
                    self.settings.nats_url,
                    tenant=tenant,
                    prefix=self.settings.prefix,
                    user=self.settings.nats_user,
                    password=password.get_secret_value() if password else None,
                    tls_ca=self.settings.nats_tls_ca,
                )
            return self._clients[tenant]

    async def close(self) -> None:
        for client in self._clients.values():
            with contextlib.suppress(Exception):
                await client.close()
        self._clients.clear()


class RunFeed:
    """One live read of a run's frames (from its first), shared by every event stream of
    the run this gateway serves: a thousand clients of one run cost one join and one
    consumer, and each reads the shared frames at its own pace."""

    def __init__(self, client: Client, run_id: str) -> None:
        self.run_id = run_id
        self.frames: list[Frame] = []  # frames[i].seq == i + 1
        self.ended = False
        self.failure: BaseException | None = None
        self.readers = 0
        self._changed = asyncio.Condition()
        self._task = asyncio.create_task(self._pump(client, run_id))

    async def _pump(self, client: Client, run_id: str) -> None:
        try:
            async for frame in client.stream(run_id, 0):
                self.frames.append(frame)
                async with self._changed:
                    self._changed.notify_all()
        except Exception as exc:  # noqa: BLE001 - every reader hears of it
            self.failure = exc
        finally:
            self.ended = True
            async with self._changed:
                self._changed.notify_all()

    async def read(self, after: int) -> AsyncIterator[Frame]:
        """Every frame with `seq > after`, then what follows, until `done`."""
        i = after
        while True:
            while i < len(self.frames):
                frame = self.frames[i]
                i += 1
                yield frame
            if self.ended:
                if self.failure is not None:
                    raise self.failure
                return
            async with self._changed:
                await self._changed.wait_for(functools.partial(self._past, i))

    def _past(self, count: int) -> bool:
        """Whether there is a frame beyond the first `count`, or there will be none."""
        return count < len(self.frames) or self.ended

    def stop(self) -> None:
        self._task.cancel()


class RunFeeds:
    """The feeds of the runs that event streams of this gateway follow now. A feed is
    opened once for all the streams of its run that start together (one `get` says
    whether the tenant has the run), and dropped a few seconds after its last reader
    left."""

    def __init__(self, idle_s: float = FEED_IDLE_S) -> None:
        self.idle_s = idle_s
        self._feeds: dict[tuple[str, str], RunFeed] = {}
        self._opening: dict[tuple[str, str], asyncio.Future[RunFeed]] = {}

    async def open(self, client: Client, run_id: str) -> RunFeed:
        """The run's feed; ClientError (NOT_FOUND) when the tenant has no such run."""
        key = (client.tenant, run_id)
        feed = self._feeds.get(key)
        if feed is not None and feed.failure is None:
            return feed
        pending = self._opening.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        opening: asyncio.Future[RunFeed] = asyncio.get_running_loop().create_future()
        opening.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._opening[key] = opening
        try:
            await client.get(run_id)  # NOT_FOUND for no run of this tenant
            feed = self._feeds[key] = RunFeed(client, run_id)
            self._idle(key, feed)  # until its first reader comes
            opening.set_result(feed)
            return feed
        except asyncio.CancelledError:
            opening.cancel()
            raise
        except Exception as exc:
            opening.set_exception(exc)
            raise
        finally:
            del self._opening[key]

    @contextlib.asynccontextmanager
    async def follow(self, client: Client, feed: RunFeed) -> AsyncIterator[RunFeed]:
        feed.readers += 1
        try:
            yield feed
        finally:
            feed.readers -= 1
            self._idle((client.tenant, feed.run_id), feed)

    def _idle(self, key: tuple[str, str], feed: RunFeed) -> None:
        if feed.readers == 0:
            asyncio.get_running_loop().call_later(self.idle_s, self._drop, key, feed)

    def _drop(self, key: tuple[str, str], feed: RunFeed) -> None:
        if feed.readers == 0 and self._feeds.get(key) is feed:
            del self._feeds[key]
            feed.stop()

    def stop(self) -> None:
        for feed in self._feeds.values():
            feed.stop()
        self._feeds.clear()


def _key_of(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.headers.get("x-api-key") or None


def sse_event(frame: Frame) -> bytes:
    """A frame as one Server-Sent Event: `id` its seq, `event` its type."""
    return f"id: {frame.seq}\nevent: {frame.type}\ndata: {frame.model_dump_json()}\n\n".encode()


async def with_heartbeats(frames: AsyncIterator[bytes], every_s: float) -> AsyncIterator[bytes]:
    """`frames`, with a comment line whenever nothing was sent for `every_s`."""
    queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=1024)

    async def pump() -> None:
        try:
            async for chunk in frames:
                await queue.put(chunk)
        finally:
            await queue.put(None)

    task = asyncio.create_task(pump())
    try:
        while True:
            try:
                chunk = await asyncio.wait_for(queue.get(), every_s)
            except TimeoutError:
                yield b": keep-alive\n\n"
                continue
            if chunk is None:
                break
            yield chunk
        await task  # a failure of the stream ends the response with its exception
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


def create_app(settings: GatewaySettings | None = None) -> FastAPI:
    """The gateway's ASGI application."""
    settings = settings or GatewaySettings()
    keys = ApiKeys(settings.gateway_keys_file)
    tenants = Tenants(settings)
    feeds = RunFeeds()
    password = settings.nats_password.get_secret_value() if settings.nats_password else None
    threads = Threads(
        settings.nats_url,
        settings.prefix,
        settings.nats_user,
        password,
        settings.stream_replicas,
        tls_ca=settings.nats_tls_ca,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            feeds.stop()
            await tenants.close()
            await threads.close()

    app = FastAPI(title="runwire gateway", version="1", lifespan=lifespan)
    app.add_middleware(
        Limits,
        max_body_bytes=settings.gateway_max_body_bytes,
        max_per_key=settings.gateway_max_requests_per_key,
    )
    if settings.gateway_cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.gateway_cors_origins,
            # PATCH and DELETE: the LangGraph runs API's threads and runs.
            allow_methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
            allow_headers=["authorization", "x-api-key", "content-type", "last-event-id"],
            expose_headers=["location", "content-location"],
        )

    @app.exception_handler(ClientError)
    async def refused(request: Request, exc: ClientError) -> Response:
        return JSONResponse(
            ErrorReply(error=exc.error).model_dump(mode="json"), status_of(exc.error)
        )

    async def client_of(request: Request) -> Client:
        """The SDK client of the request's tenant, named by its API key."""
        key = _key_of(request)
        tenant = keys.tenant_of(key) if key else None
        if tenant is None:
            raise ClientError(
                ErrorBody(
                    code=ErrorCode.UNAUTHORIZED,
                    message="give a valid API key: Authorization: Bearer <key>, or x-api-key",
                    retryable=False,
                )
            )
        return await tenants.client(tenant)

    @app.post("/v1/runs")
    async def submit(request: Request) -> Response:
        """Submit a run: the body is the submit command. 201 with the run, or 200 with
        the first run of a `request_id` used before (`duplicate: true`)."""
        client = await client_of(request)
        try:
            cmd = SubmitCommand.model_validate_json(await request.body())  # size: Limits
        except ValidationError as exc:
            return error_response(ErrorCode.INVALID_REQUEST, described(exc))
        reply = await client.submit_command(cmd)
        return JSONResponse(
            reply.model_dump(mode="json"),
            200 if reply.duplicate else 201,
            headers={"Location": f"/v1/runs/{reply.run.run_id}"},
        )

    @app.get("/v1/runs")
    async def list_runs(request: Request) -> Response:
        """The tenant's runs, newest first: `?status=`, `runner`, `session_id`,
        `created_after` and `created_before` (RFC 3339), `limit` (50), `before` (the
        `next` of the page before)."""
        client = await client_of(request)
        query: dict[str, Any] = dict(request.query_params)
        try:
            for number in ("limit", "before"):
                if number in query:
                    query[number] = int(query[number])
            cmd = ListCommand.model_validate(query)
        except ValidationError as exc:
            return error_response(ErrorCode.INVALID_REQUEST, described(exc))
        except ValueError:
            return error_response(ErrorCode.INVALID_REQUEST, "limit and before are integers")
        page = await client.list_runs(
            status=cmd.status,
            runner=cmd.runner,
            session_id=cmd.session_id,
            created_after=cmd.created_after,
            created_before=cmd.created_before,
            limit=cmd.limit,
            before=cmd.before,
        )
        return JSONResponse(page.model_dump(mode="json"))

    @app.get("/v1/runs/{run_id}")
    async def get(run_id: str, request: Request) -> Response:
        """A run's summary (a workflow run's nodes and a run's effects with it)."""
        run = await (await client_of(request)).get(run_id)
        return JSONResponse(RunReply(run=run).model_dump(mode="json"))

    @app.post("/v1/runs/{run_id}/cancel")
    async def cancel(run_id: str, request: Request) -> Response:
        """Cancel a run; a run that has ended is answered unchanged."""
        run = await (await client_of(request)).cancel(run_id)
        return JSONResponse(RunReply(run=run).model_dump(mode="json"))

    @app.post("/v1/runs/{run_id}/reschedule")
    async def reschedule(run_id: str, request: Request) -> Response:
        """Move the start of a run that waits without a job (a delayed run): the body is
        `delay_ms` or `not_before`. 409 `NOT_RESCHEDULABLE` once it has its job."""
        client = await client_of(request)
        try:
            body = json.loads(await request.body() or b"{}")  # size: Limits
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            cmd = RescheduleCommand.model_validate({**body, "run_id": run_id})
        except ValidationError as exc:
            return error_response(ErrorCode.INVALID_REQUEST, described(exc))
        except ValueError as exc:
            return error_response(ErrorCode.INVALID_REQUEST, f"the body is not JSON: {exc}")
        run = await client.reschedule(run_id, delay_ms=cmd.delay_ms, not_before=cmd.not_before)
        return JSONResponse(RunReply(run=run).model_dump(mode="json"))

    @app.get("/v1/webhooks")
    async def webhooks(request: Request) -> Response:
        """The tenant's webhook endpoints, deliveries pending and failed for good."""
        reply = await (await client_of(request)).webhooks()
        return JSONResponse(reply.model_dump(mode="json"))

    @app.put("/v1/webhooks")
    async def set_webhooks(request: Request) -> Response:
        """Replace the tenant's webhook endpoints: the body is the set_webhooks command;
        the reply holds the signing secret the first time (or with `rotate_secret`)."""
        client = await client_of(request)
        try:
            cmd = SetWebhooksCommand.model_validate_json(await request.body())  # size: Limits
        except ValidationError as exc:
            return error_response(ErrorCode.INVALID_REQUEST, described(exc))
        reply = await client.set_webhooks(
            [e.model_dump(mode="json") for e in cmd.endpoints], rotate_secret=cmd.rotate_secret
        )
        return JSONResponse(reply.model_dump(mode="json"))

    @app.post("/v1/runs/{run_id}/resume")
    async def resume(run_id: str, request: Request) -> Response:
        """Answer the interrupt a waiting run waits for: the body is the resume command
        without `run_id` (`value`, and `wait_id`, `request_id` if given)."""
        return await _answer(run_id, request, ResumeCommand)

    @app.post("/v1/runs/{run_id}/signal")
    async def signal(run_id: str, request: Request) -> Response:
        """Send a run a signal: the body is the signal command without `run_id` (`name`,
        `payload`, and `request_id` if given)."""
        return await _answer(run_id, request, SignalCommand)

    async def _answer(
        run_id: str, request: Request, model: type[ResumeCommand] | type[SignalCommand]
    ) -> Response:
        client = await client_of(request)
        try:
            body = json.loads(await request.body() or b"{}")  # size: Limits
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            body = {"request_id": str(uuid.uuid4()), **body, "run_id": run_id}
            cmd = model.model_validate(body)
        except ValidationError as exc:
            return error_response(ErrorCode.INVALID_REQUEST, described(exc))
        except ValueError as exc:
            return error_response(ErrorCode.INVALID_REQUEST, f"the body is not JSON: {exc}")
        if isinstance(cmd, ResumeCommand):
            reply: ResumeReply | SignalReply = await client.resume(
                cmd.run_id, cmd.value, wait_id=cmd.wait_id, request_id=cmd.request_id
            )
        else:
            reply = await client.signal(
                cmd.run_id, cmd.name, cmd.payload, request_id=cmd.request_id
            )
        return JSONResponse(reply.model_dump(mode="json"))

    @app.get("/v1/runs/{run_id}/signal-url")
    async def signal_url(run_id: str, name: str, request: Request) -> Response:
        """A URL that sends run `run_id` the signal `name` when POSTed to, without an API
        key (its body is the signal's payload): for a third party's webhook."""
        client = await client_of(request)
        secret = settings.gateway_signal_secret
        if secret is None:
            return error_response(
                ErrorCode.NOT_FOUND,
                "this gateway makes no signal URLs (RUNWIRE_GATEWAY_SIGNAL_SECRET is not set)",
            )
        if not re.fullmatch(SIGNAL_NAME_PATTERN, name):
            return error_response(ErrorCode.INVALID_REQUEST, f"{name!r} is not a signal's name")
        run = await client.get(run_id)  # the tenant's own run, or NOT_FOUND
        token = signal_token(secret.get_secret_value(), client.tenant, run.run_id, name)
        path = f"/v1/signals/{client.tenant}/{run.run_id}/{name}/{token}"
        return JSONResponse({"url": str(request.base_url).rstrip("/") + path})

    @app.post("/v1/signals/{tenant}/{run_id}/{name}/{token}")
    async def signal_by_url(
        tenant: str, run_id: str, name: str, token: str, request: Request
    ) -> Response:
        """A signal URL's signal (see `signal_url`): the body is its payload (JSON; none:
        null); `Idempotency-Key` or Standard Webhooks' `webhook-id` names it, so a
        delivery sent again is one signal."""
        secret = settings.gateway_signal_secret
        if secret is None or not token_fits(secret.get_secret_value(), tenant, run_id, name, token):
            return error_response(ErrorCode.NOT_FOUND, "no such signal URL")
        try:
            payload = json.loads(await request.body() or b"null")  # size: Limits
        except ValueError as exc:
            return error_response(ErrorCode.INVALID_REQUEST, f"the body is not JSON: {exc}")
        request_id = (
            request.headers.get("idempotency-key")
            or request.headers.get("webhook-id")
            or str(uuid.uuid4())
        )
        client = await tenants.client(tenant)
        reply = await client.signal(run_id, name, payload, request_id=request_id[:200])
        return JSONResponse(reply.model_dump(mode="json"))

    @app.post("/v1/sessions/{session_id}/abort")
    async def abort_session(session_id: str, request: Request) -> Response:
        """Cancel every active and queued run of a session."""
        canceled = await (await client_of(request)).abort_session(session_id)
        return JSONResponse(AbortSessionReply(canceled=canceled).model_dump(mode="json"))

    @app.get("/v1/runs/{run_id}/frames")
    async def frames(run_id: str, request: Request) -> Response:
        """The run's frames as Server-Sent Events (`id:` the seq, `event:` the type,
        `data:` the frame), from after `Last-Event-ID` (or `?after=`), until `done`."""
        client = await client_of(request)
        given = request.headers.get("last-event-id") or request.query_params.get("after") or "0"
        try:
            after = int(given)
        except ValueError:
            after = -1
        if not 0 <= after <= MAX_SEQ:
            return error_response(
                ErrorCode.INVALID_REQUEST,
                f"the cursor (Last-Event-ID or after) must be a seq from 0 to {MAX_SEQ}, "
                f"not {given[:40]!r}",
            )
        # A run that does not exist (or is another tenant's) is a 404, not an empty stream.
        feed = await feeds.open(client, run_id)

        async def events() -> AsyncIterator[bytes]:
            async with feeds.follow(client, feed):
                async for frame in feed.read(after):
                    yield sse_event(frame)
                    if frame.type == FrameType.DONE:
                        return

        return StreamingResponse(
            with_heartbeats(events(), settings.gateway_heartbeat_s),
            media_type="text/event-stream",
            headers=SSE_HEADERS,
        )

    langgraph.mount(
        app,
        client_of,
        threads,
        functools.partial(with_heartbeats, every_s=settings.gateway_heartbeat_s),
    )

    @app.get("/v1/events")
    async def events(request: Request) -> Response:
        """The tenant's run events as Server-Sent Events (`event:` the event's name,
        `data:` the RunEvent), live from now on."""
        client = await client_of(request)
        subscription = await client.events()

        async def chunks() -> AsyncIterator[bytes]:
            async for event in subscription:
                yield f"event: {event.event}\ndata: {event.model_dump_json()}\n\n".encode()

        return StreamingResponse(
            with_heartbeats(chunks(), settings.gateway_heartbeat_s),
            media_type="text/event-stream",
            headers=SSE_HEADERS,
        )

    console.mount(app)

    @app.get("/healthz")
    async def health() -> dict[str, Any]:
        """The gateway answers (it checks nothing behind it)."""
        return {"ok": True}

    return app
