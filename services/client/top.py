"""`runwire top`: a live view of a stack, built from NATS alone (no Postgres): its
events, health requests, the jobs stream, and the tenant's share (the `get_budget`
command) when the CLI asks for it.

`TopCollector` gathers the figures: run events (the recent history from the events
stream, then live) for throughput, recent runs, and recovering and failed runs; health
requests for the executors that answer; and the queue and the attempts in flight, in one
of two views:

- the stack's (the operator, or a stack without identities): the jobs stream and the
  executors' consumers, every tenant's jobs;
- a tenant's (a `tenant-<name>` identity, which may not read the jobs stream): the
  tenant's own runs that the events show queued or running.

The events are read through a consumer a tenant may create: created through the
tenant's JetStream API prefix (`<prefix>.<tenant>.JS.API`, which the submitter checks),
unacknowledged, delivering into the connection's inbox (`_INBOX_<tenant>.`) and gone
soon after `top` stops (see docs/wire-contract.md). `render` turns a `Snapshot` into a
rich table, so the view can be tested without a terminal.
"""

import asyncio
import contextlib
import io
import json
import logging
import re
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import api
from nats.js.client import JetStreamContext
from pydantic import ValidationError
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from runwire.client.connection import ClientError
from runwire.contracts.events import RunEvent, RunEventName
from runwire.contracts.health import HealthReply
from runwire.contracts.replies import BudgetReply
from runwire.contracts.status import RunStatus
from runwire.contracts.subjects import Subjects

log = logging.getLogger(__name__)

_SERVER_TIME = re.compile(r"([0-9-]+T[0-9:]+)(?:\.([0-9]+))?(Z|[+-][0-9:]+)")

# The executors' durable consumers on the jobs stream: `executor-<runner>`, one per runner.
EXECUTOR_CONSUMERS = "executor-"
REFRESH_S = 1.0
HEALTH_WINDOW_S = 0.2  # replicas answer one health request each: collect them this long
THROUGHPUT_WINDOW_S = 10.0
HISTORY_S = 60.0  # run events replayed from the events stream when `top` starts
RECENT_RUNS = 15
FAILED_RUNS = 10
TRACKED_RUNS = 1000  # runs remembered at most; the oldest are forgotten first
TEXT_WIDTH = 110
# How long a JetStream API request of `top` may take: an identity that may not make it
# hears nothing at all, and the first screen must not wait for that.
API_TIMEOUT_S = 2.0
# The events consumer is removed by the server this long after `top` stops reading.
EVENTS_INACTIVE_S = 10.0
# The first screen waits at most this long for the history to arrive.
HISTORY_WAIT_S = 3.0


@dataclass(frozen=True)
class ExecutorInfo:
    """One executor replica that answered a health request."""

    instance: str
    ok: bool
    version: str
    uptime_s: float


@dataclass(frozen=True)
class RunInfo:
    """A run as its latest event shows it; `age_s` runs from `submitted` (else `claimed`,
    else the first event seen) to its end, or to now while it is not over."""

    run_id: str
    status: RunStatus
    event: str
    attempt: int
    code: str | None
    age_s: float


@dataclass(frozen=True)
class Snapshot:
    """Everything `top` shows, as plain data."""

    at: datetime
    prefix: str
    tenant: str
    queued: int | None  # jobs waiting for an executor
    jobs_stored: int | None  # jobs in the stream, in flight included
    oldest_job_age_s: float | None
    in_flight: int | None
    executors: list[ExecutorInfo]
    ended_per_s: float
    recent: list[RunInfo]
    recovering: list[RunInfo]
    failed: list[RunInfo]
    problems: list[str] = field(default_factory=list)
    # The queue figures are the tenant's own runs', not the jobs stream's.
    tenant_only: bool = False
    # The tenant's fair share and queue, as `budget` tells them (None: not asked).
    share: BudgetReply | None = None


@dataclass
class _Run:
    first_at: datetime
    latest: RunEvent
    submitted_at: datetime | None = None
    claimed_at: datetime | None = None
    ended_at: datetime | None = None


class TopCollector:
    """Collects `top`'s figures for one tenant under one prefix; `tenant_only`: the
    tenant's view (see the module), else the stack's."""

    def __init__(
        self,
        nc: NatsClient,
        *,
        tenant: str,
        prefix: str,
        tenant_only: bool = False,
        budget: Callable[[], Awaitable[BudgetReply]] | None = None,
    ) -> None:
        self.nc = nc
        self.budget = budget
        self.tenant = tenant
        self.tenant_only = tenant_only
        self.subjects = Subjects(prefix)
        self._runs: dict[str, _Run] = {}
        self._ended: deque[datetime] = deque()
        self._sub: Subscription | None = None
        self._history_s = HISTORY_S
        # The events stream's position of the last event received (where to go on from).
        self._stream_seq: int | None = None
        self._reconnects = 0
        self._history_read = asyncio.Event()
        self._events_problem: str | None = None

    async def start(self, history_s: float = HISTORY_S) -> "TopCollector":
        """Follow run events from `history_s` ago (through the events stream; live only,
        said in every snapshot's problems, when that cannot be read)."""
        self._history_s = history_s
        await self._follow()
        return self

    async def history(self, timeout: float = HISTORY_WAIT_S) -> None:
        """Wait until the events stored when `top` started have arrived (at most
        `timeout`: what has not is shown as it comes)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._history_read.wait(), timeout)

    async def _follow(self) -> None:
        """A consumer of the tenant's run events delivering into a new inbox: from the
        event after the last one received, else from `history_s` ago."""
        await self.close()
        self._reconnects = self.nc.stats["reconnects"]
        subject = self.subjects.events(self.tenant, "*")
        inbox = self.nc.new_inbox()
        self._sub = await self.nc.subscribe(inbox, cb=self._on_event)
        config = api.ConsumerConfig(
            name=f"top-{uuid.uuid4().hex}",
            filter_subject=subject,
            deliver_subject=inbox,
            ack_policy=api.AckPolicy.NONE,
            max_deliver=1,
            inactive_threshold=EVENTS_INACTIVE_S,
            mem_storage=True,
            num_replicas=1,
        )
        if self._stream_seq is None:
            config.deliver_policy = api.DeliverPolicy.BY_START_TIME
            config.opt_start_time = datetime.now(UTC) - timedelta(seconds=self._history_s)
        else:
            config.deliver_policy = api.DeliverPolicy.BY_START_SEQUENCE
            config.opt_start_seq = self._stream_seq + 1
        try:
            info = await self._jetstream().add_consumer(self.subjects.events_stream, config)
        except (nats.errors.Error, nats.js.errors.Error, OSError) as exc:
            self._events_problem = (
                f"run history unavailable ({_why(exc)}): only events from now on are shown"
            )
            self._history_read.set()
            # Core NATS: the events from now on, delivered to whoever may subscribe.
            await self.close()
            self._sub = await self.nc.subscribe(subject, cb=self._on_event)
        else:
            self._events_problem = None
            if not info.num_pending:
                self._history_read.set()
        await self.nc.flush()

    def _jetstream(self) -> JetStreamContext:
        """The JetStream API as this identity may call it: a tenant's through its own
        prefix, which the submitter answers (the broker refuses it the server's)."""
        if self.tenant_only:
            return self.nc.jetstream(
                prefix=self.subjects.jetstream_api(self.tenant), timeout=API_TIMEOUT_S
            )
        return self.nc.jetstream(timeout=API_TIMEOUT_S)

    async def close(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._sub.unsubscribe()
            self._sub = None

    async def _on_event(self, msg: Msg) -> None:
        with contextlib.suppress(ValueError, TypeError, nats.errors.Error):
            # Delivered by the consumer: where it is in the stream, and what is left.
            metadata = msg.metadata
            self._stream_seq = metadata.sequence.stream
            if metadata.num_pending == 0:
                self._history_read.set()
        try:
            event = RunEvent.model_validate_json(msg.data)
        except ValidationError:
            log.warning("malformed run event on %s skipped", msg.subject)
            return
        self.record(event)

    def record(self, event: RunEvent) -> None:
        """Account for one run event."""
        run = self._runs.pop(event.run_id, None)  # re-inserted: dict order = last seen
        if run is None:
            run = _Run(first_at=event.at, latest=event)
            if len(self._runs) >= TRACKED_RUNS:
                del self._runs[next(iter(self._runs))]
        self._runs[event.run_id] = run
        if event.event == RunEventName.SUBMITTED:
            run.submitted_at = event.at
        elif event.event == RunEventName.CLAIMED and run.claimed_at is None:
            run.claimed_at = event.at
        if event.at >= run.latest.at:
            run.latest = event
        if event.status.terminal and run.ended_at is None:
            run.ended_at = event.at
            self._ended.append(event.at)

    async def snapshot(self) -> Snapshot:
        """The figures now; what cannot be read is listed in `problems`."""
        if self.nc.stats["reconnects"] != self._reconnects:
            # The consumer may have gone with the server it was on: follow again, from
            # the last event received.
            await self._follow()
        now = datetime.now(UTC)
        problems = [self._events_problem] if self._events_problem else []
        executors = await self._executors()
        runs = [self._info(run_id, run, now) for run_id, run in reversed(self._runs.items())]
        stored: int | None = None
        queued: int | None
        in_flight: int | None
        if self.tenant_only:
            queued, oldest, in_flight = self._own_queue(runs)
        else:
            stored, oldest, in_flight = await self._jobs(now, problems)
            queued = None if stored is None else max(0, stored - (in_flight or 0))

        while self._ended and (now - self._ended[0]).total_seconds() > THROUGHPUT_WINDOW_S:
            self._ended.popleft()
        share = None
        if self.budget is not None:
            try:
                share = await self.budget()
            except ClientError as exc:
                problems.append(f"the tenant's share is not known: {exc.message}")
        return Snapshot(
            at=now,
            prefix=self.subjects.prefix,
            tenant=self.tenant,
            queued=queued,
            jobs_stored=stored,
            oldest_job_age_s=oldest,
            in_flight=in_flight,
            executors=executors,
            ended_per_s=len(self._ended) / THROUGHPUT_WINDOW_S,
            recent=runs[:RECENT_RUNS],
            recovering=[r for r in runs if r.status == RunStatus.RECOVERING],
            failed=[r for r in runs if r.status == RunStatus.FAILED][:FAILED_RUNS],
            problems=problems,
            tenant_only=self.tenant_only,
            share=share,
        )

    @staticmethod
    def _own_queue(runs: list[RunInfo]) -> tuple[int, float | None, int]:
        """The tenant's runs queued, the oldest one's age, and those running."""
        queued = [r.age_s for r in runs if r.status == RunStatus.QUEUED]
        running = sum(r.status == RunStatus.RUNNING for r in runs)
        return len(queued), max(queued, default=None), running

    @staticmethod
    def _info(run_id: str, run: _Run, now: datetime) -> RunInfo:
        start = run.submitted_at or run.claimed_at or run.first_at
        end = run.ended_at or now
        return RunInfo(
            run_id=run_id,
            status=run.latest.status,
            event=run.latest.event,
            attempt=run.latest.attempt,
            code=run.latest.code,
            age_s=max(0.0, (end - start).total_seconds()),
        )

    async def _jobs(
        self, now: datetime, problems: list[str]
    ) -> tuple[int | None, float | None, int | None]:
        """Jobs stored, the oldest one's age, and attempts in flight, from the jobs stream
        and the executors' consumers."""
        stream = self.subjects.jobs_stream
        stored: int | None = None
        oldest: float | None = None
        in_flight: int | None = None
        try:
            # The raw reply: its state has the oldest message's time (`first_ts`), which
            # nats-py's StreamState drops (reading the message would take another request
            # and another permission).
            reply = await self.nc.request(
                f"$JS.API.STREAM.INFO.{stream}", b"", timeout=API_TIMEOUT_S
            )
            body = json.loads(reply.data)
            if "error" in body:
                raise ValueError(body["error"].get("description") or body["error"])
            state = body["state"]
            stored = int(state["messages"])
            if stored:
                oldest = max(0.0, (now - _server_time(state["first_ts"])).total_seconds())
        except (nats.errors.Error, nats.js.errors.Error, ValueError, KeyError) as exc:
            problems.append(f"jobs stream {stream}: {_why(exc)}")
        try:
            js = self.nc.jetstream(timeout=API_TIMEOUT_S)
            in_flight = sum(
                info.num_ack_pending or 0
                for info in await js.consumers_info(stream)
                if (info.name or "").startswith(EXECUTOR_CONSUMERS)
            )
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            problems.append(f"the executors' consumers: {_why(exc)}")
        return stored, oldest, in_flight

    async def _executors(self) -> list[ExecutorInfo]:
        # Every replica answers one request: listen on an inbox for a while, not for one reply.
        inbox = self.nc.new_inbox()
        sub = await self.nc.subscribe(inbox)
        found: dict[str, ExecutorInfo] = {}
        try:
            await self.nc.publish(self.subjects.health("executor"), b"{}", reply=inbox)
            deadline = time.monotonic() + HEALTH_WINDOW_S
            while (left := deadline - time.monotonic()) > 0:
                try:
                    msg = await sub.next_msg(timeout=left)
                except (nats.errors.TimeoutError, TimeoutError):
                    break
                try:
                    reply = HealthReply.model_validate_json(msg.data)
                except ValidationError:
                    log.warning("malformed health reply skipped")
                    continue
                found[reply.instance] = ExecutorInfo(
                    reply.instance, reply.ok, reply.version, reply.uptime_s
                )
        finally:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
        return sorted(found.values(), key=lambda e: e.instance)


def _why(exc: Exception) -> str:
    """An exception in words; a timeout of the JetStream API is what a refusal looks like."""
    if isinstance(exc, (nats.errors.TimeoutError, TimeoutError)):
        return f"no answer within {API_TIMEOUT_S:g} s (may this identity read it?)"
    return str(exc) or type(exc).__name__


def _server_time(text: str) -> datetime:
    """A time as nats-server writes it (RFC 3339, to the nanosecond, `Z`)."""
    found = _SERVER_TIME.fullmatch(text)
    if found is None:
        raise ValueError(f"not a time: {text!r}")
    whole, fraction, zone = found.groups()
    micros = (fraction or "").ljust(6, "0")[:6]
    return datetime.fromisoformat(f"{whole}.{micros}{'+00:00' if zone == 'Z' else zone}")


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1000:.0f}ms"
    if value < 60:
        return f"{value:.1f}s"
    if value < 3600:
        return f"{int(value // 60)}m{int(value % 60):02d}s"
    return f"{int(value // 3600)}h{int(value % 3600 // 60):02d}m"


def _count(value: int | None) -> str:
    return "?" if value is None else str(value)


_STATUS_STYLE = {
    RunStatus.FINISHED: "green",
    RunStatus.FAILED: "red",
    RunStatus.RECOVERING: "yellow",
    RunStatus.RUNNING: "cyan",
    RunStatus.INTERRUPTED: "magenta",
}


def _runs_table(title: str, runs: list[RunInfo]) -> Table | Text:
    if not runs:
        return Text(f"{title}: none")
    table = Table(title=title, title_justify="left", expand=True)
    for name in ("run", "status", "last event", "attempt", "code", "age"):
        table.add_column(name, no_wrap=True)
    for r in runs:
        table.add_row(
            r.run_id,
            Text(str(r.status), style=_STATUS_STYLE.get(r.status, "")),
            r.event,
            str(r.attempt),
            r.code or "",
            _seconds(r.age_s),
        )
    return table


def render(snap: Snapshot) -> Group:
    """The view of one snapshot."""
    summary = Table(
        title=f"runwire top  prefix={snap.prefix} tenant={snap.tenant}  "
        f"{snap.at.strftime('%H:%M:%S')} UTC",
        title_justify="left",
        expand=True,
    )
    if snap.tenant_only:
        # A tenant reads no jobs stream: its own runs, as their events show them.
        summary.caption = (
            f"queued, in flight: the tenant's runs seen since {HISTORY_S:g} s before top started"
        )
        columns = ("queued", "oldest queued", "in flight", "ended/s (10s)", "executors")
    else:
        columns = ("queued", "oldest job", "in flight", "ended/s (10s)", "executors")
    for name in columns:
        summary.add_column(name, no_wrap=True)
    summary.add_row(
        _count(snap.queued),
        _seconds(snap.oldest_job_age_s),
        _count(snap.in_flight),
        f"{snap.ended_per_s:.1f}",
        str(len(snap.executors)),
    )
    executors = Table(title="executors", title_justify="left", expand=True)
    if not snap.executors:
        executors.caption = "no executor answers health requests"
    for name in ("instance", "health", "version", "uptime"):
        executors.add_column(name, no_wrap=True)
    for e in snap.executors:
        executors.add_row(
            e.instance,
            Text("ok" if e.ok else "degraded", style="green" if e.ok else "red"),
            e.version,
            _seconds(e.uptime_s),
        )
    parts: list[Table | Text] = [summary]
    if snap.share is not None:
        parts.append(_share_table(snap.share))
    parts += [
        executors,
        _runs_table("recent runs", snap.recent),
        _runs_table("recovering", snap.recovering),
        _runs_table("failed", snap.failed),
    ]
    parts += [Text(f"! {p}", style="red") for p in snap.problems]
    return Group(*parts)


def _share_table(share: BudgetReply) -> Table:
    """The tenant's fair share of executor slots and its queue (see docs/flow-control.md)."""
    table = Table(title="the tenant's share", title_justify="left", expand=True)
    table.caption = "runs holding a job (queued for an executor or running) against its share"
    for name in ("jobs held", "share", "weight", "queued", "rate-limited", "queue capacity"):
        table.add_column(name, no_wrap=True)
    table.add_row(
        str(share.issued_runs),
        _count(share.share_runs),
        str(share.share or 1),
        str(share.queued_runs),
        str(share.rate_limited_runs),
        _count(share.max_queued_runs),
    )
    return table


def render_text(snap: Snapshot, width: int = TEXT_WIDTH) -> str:
    """The view of one snapshot as plain text (no colours), e.g. for `--once`."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, color_system=None, force_terminal=False)
    console.print(render(snap))
    return buffer.getvalue()


async def run_top(
    nc: NatsClient,
    *,
    tenant: str,
    prefix: str,
    once: bool,
    tenant_only: bool = False,
    refresh_s: float = REFRESH_S,
    budget: Callable[[], Awaitable[BudgetReply]] | None = None,
) -> None:
    """Show the live view until interrupted, or print one snapshot with `once`; the
    first screen as soon as the history has arrived. `budget`: how to ask the tenant's
    share and queue (shown when given)."""
    collector = TopCollector(
        nc, tenant=tenant, prefix=prefix, tenant_only=tenant_only, budget=budget
    )
    await collector.start()
    try:
        await collector.history()
        if once:
            print(render_text(await collector.snapshot()), end="", flush=True)
            return
        with Live(render(await collector.snapshot()), auto_refresh=False) as live:
            loop = asyncio.get_running_loop()
            next_at = loop.time()
            while True:
                # A snapshot takes the health window: keep to one refresh per `refresh_s`.
                next_at += refresh_s
                await asyncio.sleep(max(0.0, next_at - loop.time()))
                live.update(render(await collector.snapshot()), refresh=True)
    finally:
        await collector.close()
