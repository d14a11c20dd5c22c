"""The async Python client: submit, get, cancel, abort_session, join and stream.

`stream(run_id, after)` yields every frame after the cursor exactly once and in order
until `done`, re-joining by itself when the connection, the relay or the live
subscription is lost.
"""

import asyncio
import contextlib
import gc
import logging
import uuid
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from opentelemetry import propagate
from pydantic import BaseModel, ValidationError

from runwire.client.refusals import Refusals
from runwire.client.settings import (
    UP_HINT,
    load_settings,
    server_urls,
    tls_context,
    unreachable_hint,
)
from runwire.contracts.commands import (
    AbortSessionCommand,
    CancelCommand,
    EndTenantCommand,
    GetBudgetCommand,
    GetCommand,
    GetPolicyCommand,
    JoinCommand,
    ReleaseCommand,
    ResolveEffectCommand,
    SetBudgetCommand,
    SetPolicyCommand,
    SubmitCommand,
)
from runwire.contracts.errors import ErrorBody, ErrorCode, ErrorReply
from runwire.contracts.events import RunEvent
from runwire.contracts.frames import CHECKED, Frame, FrameType, Transcript
from runwire.contracts.headers import REPLAY_NEXT
from runwire.contracts.health import HealthReply
from runwire.contracts.replies import (
    AbortSessionReply,
    BudgetReply,
    EndTenantReply,
    FrameChannel,
    JoinReply,
    PolicyReply,
    ReleaseReply,
    RunReply,
    RunSummary,
    SubmitReply,
)
from runwire.contracts.subjects import Subjects, inbox_prefix
from runwire.contracts.workflows import WorkflowDefinition, WorkflowRef

__all__ = ["Client", "ClientError", "Transcript"]

log = logging.getLogger(__name__)

# Validation context for what runwire's relay sends: frames it stored after their data
# was checked (see `runwire.contracts.frames.CHECKED`).
STORED_FRAMES = {CHECKED: True}
# A reply this large (a long replay: some 10k frames per MB) is parsed with the garbage
# collector paused: its objects all live on, and collections triggered by making them
# (a full one among them, in a process holding many objects) doubled a replay's time.
LARGE_REPLY_BYTES = 256 * 1024

REQUEST_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 5.0
HEALTH_WAIT_S = 0.5
# A probe (`runwire health SERVICE --local`) waits this long at most, and returns as soon
# as its replica says it is ok.
PROBE_WAIT_S = 5.0
REJOIN_DELAY_S = 0.2
JOIN_FIRST_TIMEOUT_S = 2.0
# With no frame for this long, the client re-joins to check the run is still alive.
LIVE_IDLE_S = 5.0
# A live-frames consumer the client no longer reads is removed by the server after this.
FOLLOW_INACTIVE_S = 10.0
# Frames held back waiting for an earlier one before the client joins again.
EARLY_LIMIT = 256
# Turns of the event loop that take a request onto the connection: the request's task,
# the one that waits for a refusal beside it, NATS's writer.
SEND_HOPS = 3
# Runs submitted by this client that it remembers as fresh (see `Client.stream`), and
# how long one may stay quiet in the stream before the client joins it.
FRESH_RUNS = 10_000
FRESH_IDLE_S = 1.0
# How long a client waits for the stream to say whether it holds a frame of a run.
LAST_FRAME_TIMEOUT_S = 1


# The status of a direct get that found no message.
NOT_FOUND = "404"


def _unauthorized(message: str) -> "ClientError":
    return ClientError(ErrorBody(code=ErrorCode.UNAUTHORIZED, message=message, retryable=False))


class ClientError(Exception):
    """A command answered with an error, or no service answered."""

    def __init__(self, error: ErrorBody) -> None:
        super().__init__(f"{error.code}: {error.message}")
        self.error = error
        self.code = error.code
        self.message = error.message
        self.retryable = error.retryable


@contextlib.contextmanager
def _collections_paused(pause: bool) -> Iterator[None]:
    """The garbage collector paused for the block when `pause` and it runs (as it was
    after: a caller that disabled it keeps it disabled).

    What the block made (a long replay's frames: tens of thousands of objects) is then
    handed to the oldest generation as it is: the next young collection would otherwise
    scan it all at once (5 ms for 10k frames) only to find it alive. (The program's
    other young objects go with it: a garbage cycle among them waits for the next full
    collection.) Not when the program keeps objects frozen (`gc.freeze`, as pre-forking
    servers do): that freeze is left as it is."""
    if not pause or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
        if gc.get_freeze_count() == 0:
            gc.freeze()
            gc.unfreeze()
    finally:
        gc.enable()


def _parse_reply(msg: Msg, reply: type[Any]) -> Any:
    """A reply message as `reply`, or the ClientError of the error it carries."""
    try:
        # Frames in a reply come from the relay, which only stores frames whose data was
        # checked when they were made: their data is not checked again.
        with _collections_paused(len(msg.data) >= LARGE_REPLY_BYTES):
            return reply.model_validate_json(msg.data, context=STORED_FRAMES)
    except ValidationError:
        raise ClientError(ErrorReply.model_validate_json(msg.data).error) from None


def _drop(task: asyncio.Task[Any]) -> None:
    """A request no longer wanted: cancelled, or its outcome taken (an error included)."""
    if not task.cancel() and not task.cancelled():
        task.exception()


def _replay_next(msg: Msg) -> int | None:
    """The cursor a cut join reply says its rest starts after (see REPLAY_NEXT)."""
    value = (msg.headers or {}).get(REPLAY_NEXT, "")
    return int(value) if value.isdecimal() else None


async def _next(sub: Subscription, idle: float) -> Msg | None:
    """The subscription's next message, or None once it stayed quiet for `idle` seconds
    or failed. What has arrived is taken from the subscription's queue at once and only a
    wait for more is timed: nats-py's `next_msg` costs a task and a timer a message, a
    third of a client's time per frame. (Its own `next_msg` where its queue is not there.)"""
    queue: asyncio.Queue[Msg] | None = getattr(sub, "_pending_queue", None)
    if queue is None or not hasattr(sub, "_pending_size"):
        try:
            return await sub.next_msg(timeout=idle)
        except (nats.errors.TimeoutError, TimeoutError, nats.errors.Error):
            return None
    if queue.empty():
        try:
            # A timeout scope, not `wait_for`: no task per wait (a token's frame each).
            async with asyncio.timeout(idle):
                msg = await queue.get()
        except TimeoutError:
            return None
    else:
        msg = queue.get_nowait()
    queue.task_done()
    sub._pending_size -= len(msg.data)
    return msg


class Client:
    """A connection to runwire for one tenant."""

    def __init__(
        self, nc: NatsClient, *, tenant: str, prefix: str, refusals: Refusals | None = None
    ) -> None:
        self.nc = nc
        self.tenant = tenant
        # The broker's refusals, on a connection with an identity (a broker without
        # authentication refuses nothing: requests are not watched for it).
        self._refusals = refusals
        self.subjects = Subjects(prefix)
        # Runs this client submitted lately, whose frames are all still in the stream:
        # the first `stream` of one follows the stream from its first frame at once,
        # without a join (run id → where its frames are).
        self._fresh: OrderedDict[str, FrameChannel] = OrderedDict()

    @classmethod
    async def connect(
        cls,
        url: str | None = None,
        *,
        tenant: str | None = None,
        prefix: str | None = None,
        user: str | None = None,
        password: str | None = None,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        inbox: str | None = None,
        tls_ca: Path | None = None,
    ) -> "Client":
        """Connect to NATS; after the first connection, reconnect for as long as it takes.

        Unless `url`, `tenant` and `prefix` are all given, what is not given is found the
        way the CLI finds it: `RUNWIRE_NATS_URL`, `RUNWIRE_TENANT`, `RUNWIRE_PREFIX`,
        `RUNWIRE_NATS_USER` and `RUNWIRE_NATS_PASSWORD` (on a broker that enforces
        identities: the tenant's, which `runwire tenant add` writes), then the nearest
        `.runwire/env` (which `make up` writes), then the defaults; a settings file named
        by `RUNWIRE_ENV_FILE` wins over the variables. Refused credentials
        raise ClientError(UNAUTHORIZED). Replies arrive under the tenant's inbox prefix
        (`_INBOX_<tenant>`), or `inbox`: an identity that is not a tenant's (a service's,
        asking its own health) hears replies only in its own. `tls_ca` (or
        `RUNWIRE_NATS_TLS_CA`): the authority of the servers' certificates, for a TLS
        connection.
        """
        hint = UP_HINT
        if url is None or tenant is None or prefix is None:
            found = load_settings()
            if url is None:
                url, hint = found.nats_url, unreachable_hint(found)
            tenant = found.tenant if tenant is None else tenant
            prefix = found.prefix if prefix is None else prefix
            if user is None and found.nats_user is not None:
                user = found.nats_user
                if password is None and found.nats_password is not None:
                    password = found.nats_password.get_secret_value()
            tls_ca = found.nats_tls_ca if tls_ca is None else tls_ca
        refusals = Refusals()
        connecting = asyncio.ensure_future(
            nats.connect(
                server_urls(url),
                dont_randomize=True,
                name="runwire-client",
                max_reconnect_attempts=-1,
                error_cb=refusals.on_error,
                inbox_prefix=inbox or inbox_prefix(tenant),
                user=user,
                password=password,
                tls=tls_context(tls_ca),
            )
        )
        refused = asyncio.ensure_future(refusals.credentials_refused.wait())
        try:
            await asyncio.wait(
                [connecting, refused], timeout=connect_timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if not connecting.done():
                connecting.cancel()
                if refused.done():
                    raise _unauthorized(
                        f"NATS at {url} refused the identity {user or '(none)'}: give the "
                        "tenant's settings (RUNWIRE_NATS_USER, RUNWIRE_NATS_PASSWORD; "
                        "`runwire tenant add` writes them)"
                    )
                raise TimeoutError(f"no connection within {connect_timeout}s")
            nc = connecting.result()
        except (TimeoutError, OSError, nats.errors.Error) as exc:
            raise ClientError(
                ErrorBody(
                    code=ErrorCode.UNAVAILABLE,
                    message=f"cannot reach NATS at {url} ({hint})",
                    retryable=True,
                )
            ) from exc
        finally:
            refused.cancel()
        return cls(
            nc, tenant=tenant, prefix=prefix, refusals=refusals if user is not None else None
        )

    async def health(
        self,
        service: str,
        *,
        wait: float = HEALTH_WAIT_S,
        enough: Callable[[HealthReply], bool] | None = None,
    ) -> list[HealthReply]:
        """The health of every replica of `service` (submitter, executor, relay,
        recovery) that answers within `wait` seconds; an executor's lists its runners.
        With `enough`, the replies so far as soon as one is `enough`."""
        inbox = self.nc.new_inbox()
        sub = await self.nc.subscribe(inbox)
        replies: list[HealthReply] = []
        try:
            await self.nc.publish(self.subjects.health(service), b"", reply=inbox)
            deadline = asyncio.get_running_loop().time() + wait
            while (left := deadline - asyncio.get_running_loop().time()) > 0:
                try:
                    msg = await sub.next_msg(timeout=left)
                except nats.errors.TimeoutError:
                    break
                try:
                    reply = HealthReply.model_validate_json(msg.data)
                except ValidationError:
                    continue
                replies.append(reply)
                if enough is not None and enough(reply):
                    break
        finally:
            await sub.unsubscribe()
        return replies

    async def close(self) -> None:
        if not self.nc.is_closed:
            await self.nc.close()

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _send(
        self, subject: str, data: bytes, headers: dict[str, str] | None, timeout: float
    ) -> Msg:
        """A request's reply; on a broker that enforces identities, UNAUTHORIZED as soon
        as it says it dropped the request."""
        if self._refusals is None:
            return await self.nc.request(subject, data, headers=headers, timeout=timeout)
        refused = self._refusals.watch(subject)
        request = asyncio.ensure_future(
            self.nc.request(subject, data, headers=headers, timeout=timeout)
        )
        try:
            waiting: list[asyncio.Future[Any]] = [request, refused]
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if refused.done() and not request.done():
                request.cancel()
                raise _unauthorized(refused.result())
            return await request
        finally:
            self._refusals.forget(subject, refused)

    async def _request(
        self, name: str, body: BaseModel, reply: type[Any], *, timeout: float = REQUEST_TIMEOUT_S
    ) -> Any:
        return _parse_reply(await self._ask(name, body, timeout), reply)

    async def _ask(self, name: str, body: BaseModel, timeout: float) -> Msg:
        """The reply message of a command request, not yet read."""
        subject = self.subjects.command(self.tenant, name)
        # The caller's trace context, when it traces: a submitted run joins its trace.
        headers: dict[str, str] = {}
        propagate.inject(headers)
        data = body.model_dump_json(exclude_unset=True).encode()
        try:
            return await self._send(subject, data, headers or None, timeout)
        except nats.errors.NoRespondersError as exc:
            raise ClientError(
                ErrorBody(
                    code=ErrorCode.UNAVAILABLE,
                    message=f"no service answers {subject}",
                    retryable=True,
                )
            ) from exc
        except (nats.errors.TimeoutError, TimeoutError) as exc:
            raise ClientError(
                ErrorBody(
                    code=ErrorCode.UNAVAILABLE,
                    message=f"no reply on {subject} within {timeout}s",
                    retryable=True,
                )
            ) from exc

    async def submit(
        self, input: dict[str, Any], *, request_id: str | None = None, **options: Any
    ) -> SubmitReply:
        """Submit a run; `options` are the optional fields of the submit command."""
        cmd = SubmitCommand(request_id=request_id or str(uuid.uuid4()), input=input, **options)
        return await self.submit_command(cmd)

    async def submit_command(self, cmd: SubmitCommand) -> SubmitReply:
        """Submit a run from a submit command already made (as the gateway does)."""
        reply: SubmitReply = await self._request("submit", cmd, SubmitReply)
        if not reply.duplicate:
            self._fresh[reply.run.run_id] = reply.frames
            while len(self._fresh) > FRESH_RUNS:
                self._fresh.popitem(last=False)
        return reply

    async def submit_workflow(
        self,
        release_id: str,
        input: dict[str, Any],
        *,
        version: int | None = None,
        request_id: str | None = None,
        **options: Any,
    ) -> SubmitReply:
        """Submit a workflow run of release `release_id` (its highest version unless
        `version`) on `input`; `options` are the other optional fields of submit."""
        cmd = SubmitCommand(
            request_id=request_id or str(uuid.uuid4()),
            workflow=WorkflowRef(release_id=release_id, version=version, input=input),
            **options,
        )
        return await self.submit_command(cmd)

    async def release(
        self, release_id: str, version: int, definition: WorkflowDefinition | dict[str, Any]
    ) -> ReleaseReply:
        """Publish a workflow release (nodes and edges) under an id and a version, for
        good; the same again answers `created: false`, another definition is refused."""
        if not isinstance(definition, WorkflowDefinition):
            definition = WorkflowDefinition.model_validate(definition)
        cmd = ReleaseCommand(release_id=release_id, version=version, definition=definition)
        reply: ReleaseReply = await self._request("release", cmd, ReleaseReply)
        return reply

    async def get(self, run_id: str) -> RunSummary:
        reply: RunReply = await self._request("get", GetCommand(run_id=run_id), RunReply)
        return reply.run

    async def cancel(self, run_id: str) -> RunSummary:
        reply: RunReply = await self._request("cancel", CancelCommand(run_id=run_id), RunReply)
        return reply.run

    async def resolve_effect(
        self,
        run_id: str,
        key: str,
        *,
        receipt: dict[str, Any] | None = None,
        error: str | None = None,
    ) -> RunSummary:
        """Settle a side effect whose outcome is unknown (or that failed by its deadline)
        with the receipt of what happened, or why it did not (operators only)."""
        cmd = ResolveEffectCommand(run_id=run_id, key=key, receipt=receipt, error=error)
        reply: RunReply = await self._request("resolve_effect", cmd, RunReply)
        return reply.run

    async def set_budget(self, **limits: int | None) -> BudgetReply:
        """Set the tenant's limits: `tokens`, `cost` (units the tenant defines),
        `max_active_runs`, `max_runs_per_day` (a limit left out keeps its value; None
        removes it)."""
        reply: BudgetReply = await self._request(
            "set_budget", SetBudgetCommand(**limits), BudgetReply
        )
        return reply

    async def budget(self) -> BudgetReply:
        """The tenant's budgets, what its runs used and what they hold reserved."""
        reply: BudgetReply = await self._request("get_budget", GetBudgetCommand(), BudgetReply)
        return reply

    async def set_policy(self, *, effects: list[str] | None) -> PolicyReply:
        """Set the effect kinds the tenant's runs may perform (None: every kind); until
        it is set, they may perform none. An operator's command (a tenant's own identity
        may not). Runs submitted before hold a stale authorization: their next effect
        fails with AUTHORIZATION_STALE."""
        reply: PolicyReply = await self._request(
            "set_policy", SetPolicyCommand(effects=effects), PolicyReply
        )
        return reply

    async def policy(self) -> PolicyReply:
        """The tenant's policy (version 0: never set, so no effect kind is allowed)."""
        reply: PolicyReply = await self._request("get_policy", GetPolicyCommand(), PolicyReply)
        return reply

    async def abort_session(self, session_id: str) -> list[str]:
        reply: AbortSessionReply = await self._request(
            "abort_session", AbortSessionCommand(session_id=session_id), AbortSessionReply
        )
        return reply.canceled

    async def end_tenant(self) -> list[str]:
        """Cancel every active and queued run of this client's tenant; their ids, oldest
        first (an operator's command: a tenant's identity is refused it)."""
        reply: EndTenantReply = await self._request(
            "end_tenant", EndTenantCommand(), EndTenantReply
        )
        return reply.canceled

    async def join(
        self, run_id: str, after: int = 0, *, timeout: float = REQUEST_TIMEOUT_S
    ) -> JoinReply:
        reply: JoinReply = await self._request(
            "join", JoinCommand(run_id=run_id, after=after), JoinReply, timeout=timeout
        )
        return reply

    async def stream(self, run_id: str, after: int = 0) -> AsyncIterator[Frame]:
        """Every frame with `seq > after`, once each, in order, ending with `done`."""
        cursor = after
        fresh = self._fresh.pop(run_id, None) if after == 0 else None
        if fresh is not None:
            # A run this client just submitted: every frame it has is on its subject, or
            # still in the stream, from its first, so it is followed there at once and
            # the relay is not asked (see `_in_order`). A gap (frames the stream no
            # longer holds), or a quiet run, and it is joined.
            frames = self._in_order(
                fresh.subject, fresh.stream, 1, cursor, idle=FRESH_IDLE_S, live=True
            )
            async for frame in frames:
                cursor = frame.seq
                yield frame
                if frame.type == FrameType.DONE:
                    return
        failures = 0
        # The next join, already asked for: a reply cut at the relay's size limit names
        # the cursor of the rest, which is asked for while this reply is read.
        ahead: tuple[int, asyncio.Task[Msg]] | None = None
        try:
            while True:
                # Short at first, longer after each failure: a relay that stopped
                # answering (frozen) still gets its share of joins until NATS drops it,
                # and the next try most likely reaches another relay.
                timeout = min(REQUEST_TIMEOUT_S, JOIN_FIRST_TIMEOUT_S * 2**failures)
                asked, ahead = ahead, None
                try:
                    if asked is not None and asked[0] == cursor:
                        msg = await asked[1]
                    else:
                        if asked is not None:
                            _drop(asked[1])
                        msg = await self._ask(
                            "join", JoinCommand(run_id=run_id, after=cursor), timeout
                        )
                    rest = _replay_next(msg)
                    if rest is not None and rest > cursor:
                        command = JoinCommand(run_id=run_id, after=rest)
                        ahead = (rest, asyncio.ensure_future(self._ask("join", command, timeout)))
                        # Out before this reply is read: reading it keeps the event loop
                        # for a while, and a request is only sent from the loop.
                        for _ in range(SEND_HOPS):
                            await asyncio.sleep(0)
                    reply: JoinReply = _parse_reply(msg, JoinReply)
                except ClientError as exc:
                    if not exc.retryable:
                        raise
                    failures += 1
                    log.info("join failed (%s); joining again", exc.message)
                    await asyncio.sleep(REJOIN_DELAY_S)
                    continue
                failures = 0
                for frame in reply.replay:
                    if frame.seq > cursor:
                        cursor = frame.seq
                        yield frame
                        if frame.type == FrameType.DONE:
                            return
                if reply.live is None:
                    if not reply.replay:
                        run = reply.run
                        # `last_seq` is final only once the run's frames are complete.
                        if run.status.terminal and run.frames_complete and cursor >= run.last_seq:
                            return  # the caller already has every frame, `done` included
                        await asyncio.sleep(REJOIN_DELAY_S)
                    continue
                live = reply.live
                frames = self._in_order(live.subject, live.stream, live.stream_seq, cursor)
                async for frame in frames:
                    cursor = frame.seq
                    yield frame
                    if frame.type == FrameType.DONE:
                        return
        finally:
            if ahead is not None:
                _drop(ahead[1])

    async def _in_order(
        self,
        subject: str,
        stream: str,
        start: int,
        cursor: int,
        *,
        idle: float = LIVE_IDLE_S,
        live: bool = False,
    ) -> AsyncIterator[Frame]:
        """Live frames after `cursor`, strictly by seq: one stored out of order (a publish
        the relay retried) waits for the frames before it. Ends when the subscription
        goes quiet or fails, or when a frame is missing for good (the caller joins).

        `live`: a run just submitted, of which nothing is stored yet, is followed on its
        subject itself, without a JetStream consumer: creating and removing one costs
        nats-server about 240 µs, and each frame it delivers about 19 µs more than a
        plain subscription does. The stream is read instead, from `start`, when it holds
        a frame of the run already, or once the subscription misses one (a frame comes
        ahead of it)."""
        early: dict[int, Frame] = {}
        listening = live
        source: AsyncGenerator[Frame | None, None] = (
            self._listen(subject, stream, idle)
            if live
            else self._follow(subject, stream, start, idle)
        )
        try:
            while True:
                heard = False
                async for frame in source:
                    heard = True
                    if frame is None:
                        continue  # listening: the stream held nothing of the run yet
                    if frame.seq > cursor:
                        early[frame.seq] = frame
                    if len(early) > EARLY_LIMIT:
                        return
                    while cursor + 1 in early:
                        frame = early.pop(cursor + 1)
                        cursor = frame.seq
                        yield frame
                        if frame.type == FrameType.DONE:
                            return
                    if listening and early:
                        break  # a frame ahead of one the subscription missed: in the stream
                else:
                    if not listening or heard:
                        return  # quiet (or failed): the caller joins
                await source.aclose()
                source, listening = self._follow(subject, stream, start, idle), False
        finally:
            await source.aclose()

    async def _listen(
        self, subject: str, stream: str, idle: float
    ) -> AsyncGenerator[Frame | None, None]:
        """Frames as they are published on `subject`, through a plain subscription, until
        it stays quiet for `idle` or fails; first None once the subscription is in place
        and the stream holds no frame of the subject. Nothing at all when the stream
        holds one already (published before the subscription was in place), or cannot
        tell: the caller reads the stream."""
        try:
            sub = await self.nc.subscribe(subject)
        except nats.errors.Error as exc:
            log.info("live subscription failed (%s); reading the stream", exc)
            return
        try:
            try:
                await self.nc.flush(timeout=LAST_FRAME_TIMEOUT_S)  # in place on the server
                last = await self._send(
                    f"$JS.API.DIRECT.GET.{stream}.{subject}", b"", None, LAST_FRAME_TIMEOUT_S
                )
            except (nats.errors.Error, ClientError, TimeoutError) as exc:
                log.info("the stream did not say what it holds (%s); reading it", exc)
                return
            if (last.headers or {}).get("Status") != NOT_FOUND:
                return
            yield None
            async for frame in self._frames_on(sub, subject, idle):
                yield frame
        finally:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()

    async def events(self, run_id: str = "*") -> AsyncIterator[RunEvent]:
        """Follow run events of this tenant live (all runs, or one). The subscription is
        in place when this returns: `async for event in await client.events(): ...`."""
        sub = await self.nc.subscribe(self.subjects.events(self.tenant, run_id))
        await self.nc.flush()

        async def follow() -> AsyncIterator[RunEvent]:
            try:
                async for msg in sub.messages:
                    try:
                        yield RunEvent.model_validate_json(msg.data)
                    except ValidationError:
                        log.warning("malformed run event on %s skipped", msg.subject)
            finally:
                with contextlib.suppress(nats.errors.Error):
                    await sub.unsubscribe()

        return follow()

    async def _follow(
        self, subject: str, stream: str, start: int, idle: float
    ) -> AsyncGenerator[Frame, None]:
        """Live frames from a stream position, until the subscription goes quiet or fails.

        Through a consumer of its own, filtered to the run's subject and created with the
        filtered form of the API (`$JS.API.CONSUMER.CREATE.<stream>.<name>.<subject>`): a
        broker that enforces identities lets a tenant create only consumers filtered to
        its own runs. Unacknowledged, in memory, and removed by the server once unused."""
        js = self.nc.jetstream()
        inbox = self.nc.new_inbox()
        try:
            sub = await self.nc.subscribe(inbox)
        except nats.errors.Error as exc:
            log.info("live subscription failed (%s); joining again", exc)
            return
        try:
            await js.add_consumer(
                stream,
                ConsumerConfig(
                    name=f"follow-{uuid.uuid4().hex}",
                    filter_subject=subject,
                    deliver_subject=inbox,
                    deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                    opt_start_seq=start,
                    ack_policy=AckPolicy.NONE,
                    inactive_threshold=FOLLOW_INACTIVE_S,
                    mem_storage=True,
                    num_replicas=1,
                ),
            )
        except (nats.errors.Error, nats.js.errors.Error, OSError) as exc:
            log.info("live subscription failed (%s); joining again", exc)
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
            return
        try:
            async for frame in self._frames_on(sub, subject, idle):
                yield frame
        finally:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()

    async def _frames_on(
        self, sub: Subscription, subject: str, idle: float
    ) -> AsyncGenerator[Frame, None]:
        """The frames `sub` receives, until it stays quiet for `idle` or the connection
        closes (the caller re-joins to learn whether the run goes on)."""
        run_id = Subjects.run_of_frames(subject)
        while not self.nc.is_closed:
            msg = await _next(sub, idle)
            if msg is None:
                return
            try:
                frame = Frame.model_validate_json(msg.data, context=STORED_FRAMES)
            except ValidationError:
                log.warning("malformed frame on %s skipped", subject)
                continue
            if frame.run_id != run_id:
                # Another run's frame, delivered here by someone's consumer (the broker
                # lets a consumer deliver to any subject): never part of this run.
                log.warning("a frame of another run on %s skipped", subject)
                continue
            yield frame
