"""`runwire top`: a live view of a stack, built from NATS alone (no Postgres).

`TopCollector` gathers the figures: the jobs stream and its `executor` consumer for the
queue and the attempts in flight, health requests for the executors that answer, and
run events (the recent history from the events stream, then live) for throughput,
recent runs, and recovering and failed runs. `render` turns a `Snapshot` into a rich
table, so the view can be tested without a terminal.
"""

import asyncio
import contextlib
import io
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import ConsumerConfig, DeliverPolicy
from pydantic import ValidationError
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from runwire.contracts.events import RunEvent, RunEventName
from runwire.contracts.health import HealthReply
from runwire.contracts.status import RunStatus
from runwire.contracts.subjects import Subjects

log = logging.getLogger(__name__)

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


@dataclass
class _Run:
    first_at: datetime
    latest: RunEvent
    submitted_at: datetime | None = None
    claimed_at: datetime | None = None
    ended_at: datetime | None = None


class TopCollector:
    """Collects `top`'s figures for one tenant under one prefix."""

    def __init__(self, nc: NatsClient, *, tenant: str, prefix: str) -> None:
        self.nc = nc
        self.tenant = tenant
        self.subjects = Subjects(prefix)
        self._runs: dict[str, _Run] = {}
        self._ended: deque[datetime] = deque()
        self._sub: Subscription | None = None

    async def start(self, history_s: float = HISTORY_S) -> "TopCollector":
        """Follow run events: from `history_s` ago via the events stream, or live only
        (core NATS) when the stream cannot be read."""
        subject = self.subjects.events(self.tenant, "*")
        try:
            self._sub = await self.nc.jetstream().subscribe(
                subject,
                stream=self.subjects.events_stream,
                ordered_consumer=True,
                cb=self._on_event,
                config=ConsumerConfig(
                    deliver_policy=DeliverPolicy.BY_START_TIME,
                    opt_start_time=datetime.now(UTC) - timedelta(seconds=history_s),
                ),
            )
        except (nats.errors.Error, nats.js.errors.Error, OSError) as exc:
            log.info("events stream unavailable (%s); following live events only", exc)
            self._sub = await self.nc.subscribe(subject, cb=self._on_event)
        await self.nc.flush()
        return self

    async def close(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._sub.unsubscribe()
            self._sub = None

    async def _on_event(self, msg: Msg) -> None:
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
        now = datetime.now(UTC)
        problems: list[str] = []
        stored, oldest, in_flight = await self._jobs(now, problems)
        executors = await self._executors()
        queued = None if stored is None else max(0, stored - (in_flight or 0))

        while self._ended and (now - self._ended[0]).total_seconds() > THROUGHPUT_WINDOW_S:
            self._ended.popleft()
        runs = [self._info(run_id, run, now) for run_id, run in reversed(self._runs.items())]
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
        )

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
        js = self.nc.jetstream()
        stream = self.subjects.jobs_stream
        stored: int | None = None
        oldest: float | None = None
        in_flight: int | None = None
        try:
            state = (await js.stream_info(stream)).state
            stored = state.messages
            if state.messages:
                first = await js.get_msg(stream, seq=state.first_seq)
                if first.time is not None:
                    oldest = max(0.0, (now - first.time).total_seconds())
        except nats.js.errors.NotFoundError:
            # The oldest message may have been acked between the two calls.
            pass
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            problems.append(f"jobs stream {stream}: {exc}")
        try:
            in_flight = sum(
                info.num_ack_pending or 0
                for info in await js.consumers_info(stream)
                if (info.name or "").startswith(EXECUTOR_CONSUMERS)
            )
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            problems.append(f"the executors' consumers: {exc}")
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
    for name in ("queued", "oldest job", "in flight", "ended/s (10s)", "executors"):
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
    parts: list[Table | Text] = [
        summary,
        executors,
        _runs_table("recent runs", snap.recent),
        _runs_table("recovering", snap.recovering),
        _runs_table("failed", snap.failed),
    ]
    parts += [Text(f"! {p}", style="red") for p in snap.problems]
    return Group(*parts)


def render_text(snap: Snapshot, width: int = TEXT_WIDTH) -> str:
    """The view of one snapshot as plain text (no colours), e.g. for `--once`."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, color_system=None, force_terminal=False)
    console.print(render(snap))
    return buffer.getvalue()


async def run_top(
    nc: NatsClient, *, tenant: str, prefix: str, once: bool, refresh_s: float = REFRESH_S
) -> None:
    """Show the live view until interrupted, or print one snapshot with `once`."""
    collector = await TopCollector(nc, tenant=tenant, prefix=prefix).start()
    try:
        if once:
            # Let the replayed history arrive before the one and only snapshot.
            await asyncio.sleep(HEALTH_WINDOW_S)
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
