"""The one way out of a transaction: publishing what committed transitions imply.

A guarded transition writes, in its own transaction, the messages it implies to the
`outbox` table (Postgres triggers do it, so no transition can forget one): the job of
the run's next attempt with the time it is due, the closing frames of a run that ended
(an `error` frame, `done`), and the job of the next run of its session. Its run event is
its `run_events` row, written by the same statement.
Two things publish those rows, each with the row's stable `Nats-Msg-Id`, so a repeat
is stored once:

- `Outbox.dispatch`, in the service that committed, right after the commit: the jobs
  and frames of its transaction that were due at once (the fast path: a submit's job, an
  attempt's `done`). A submit's statement returns its jobs itself (`submit_runs`), so
  they are published as they came; other transactions' rows are looked up: those that
  commit while a dispatch is under way together in the next one. Published rows are
  deleted in batches in the background: under load a service makes one outbox query
  per batch, not per commit.
- `Outbox.sweep`, in recovery, one replica at a time: run events (one publisher keeps a
  run's events in the order of its transitions), jobs that became due later (a retry
  after its backoff, a recovered run), and whatever a crashed or cut-off service left
  (rows older than the grace).

A dispatch that fails is not retried here: the sweep publishes the rows after the grace.
Frames a runner emits do not come this way; they go straight to JetStream (the hot path).
"""

import asyncio
import dataclasses
import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import orjson
from opentelemetry.trace import SpanKind

from runwire.runtime import faults, frame_chain, tracing
from runwire.runtime.broker import Broker, failed_publish
from runwire.runtime.errors import QueueFull, RunwireError
from runwire.runtime.logs import fields
from runwire.runtime.store import OutboxKind, OutboxMessage, Run, Store

log = logging.getLogger(__name__)

# How often published rows are deleted (one statement for all of them).
DELETE_EVERY_S = 0.05
SWEEP_BATCH = 500
# Runs whose last stored frame the outbox remembers (see `expect_tail`).
TAILS_KEPT = 10_000


@dataclass
class Dispatched:
    """What a dispatch found: the runs whose job a full queue refused (the submitter
    fails such a new run with QUEUE_FULL; any other caller leaves the job to the sweep)."""

    queue_full: list[str] = field(default_factory=list)


class Outbox:
    """Publishes outbox rows for one service process."""

    def __init__(self, store: Store, broker: Broker) -> None:
        self.store = store
        self.broker = broker
        self._published: list[int] = []
        self._deleter: asyncio.Task[None] | None = None
        # Transactions whose messages are to be published, with who waits for them.
        self._waiting: dict[str, asyncio.Future[Dispatched]] = {}
        self._dispatcher: asyncio.Task[None] | None = None
        # Where runs' frames end, as the attempts of this process left them: their
        # closing frames go after without asking the stream (the oldest forgotten).
        self._tails: OrderedDict[str, frame_chain.Tail] = OrderedDict()

    def expect_tail(self, run_id: str, tail: frame_chain.Tail) -> None:
        """The run's last stored frame (its attempt's), for the frames its end implies."""
        self._tails[run_id] = tail
        if len(self._tails) > TAILS_KEPT:
            self._tails.popitem(last=False)

    def _subject(self, message: OutboxMessage) -> tuple[str, str]:
        """The subject and the stream of a message, by its kind."""
        s = self.broker.subjects
        if message.kind == OutboxKind.JOB:
            # Jobs written before jobs carried their runner were all `scripted` runs'.
            return s.job(message.runner or "scripted", message.run_id), s.jobs_stream
        return s.events(message.tenant, message.run_id), s.events_stream

    async def _send(self, message: OutboxMessage) -> "asyncio.Future[int]":
        if message.kind == OutboxKind.FRAME:
            return await self._append(message)
        subject, stream = self._subject(message)
        try:
            return await self.broker.send_message(
                subject,
                stream,
                message.body.encode(),
                message.msg_id,
                traceparent=message.trace_parent,
            )
        except RunwireError as exc:
            return failed_publish(exc)

    async def _append(self, message: OutboxMessage) -> "asyncio.Future[int]":
        """Place a frame Postgres wrote after the run's last stored frame (each frame
        waits for the one before it: frames of a run are not pipelined)."""
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        try:
            placed = await frame_chain.append(
                self.broker,
                orjson.loads(message.body),
                self.store.archived_seq,
                traceparent=message.trace_parent,
                tail=self._tails.pop(message.run_id, None),
            )
        except RunwireError as exc:
            return failed_publish(exc)
        if placed != frame_chain.Placed.STORED:
            log.info(
                "a closing frame not published: %s",
                placed.value,
                extra=fields(run_id=message.run_id, tenant=message.tenant),
            )
        done.set_result(0)
        return done

    async def _publish_all(
        self, messages: Sequence[OutboxMessage]
    ) -> list[tuple[OutboxMessage, RunwireError | None]]:
        """Publish in order, pipelined (one connection keeps them in order); each
        message with what went wrong, if anything."""
        sends = [await self._send(m) for m in messages]
        results: list[tuple[OutboxMessage, RunwireError | None]] = []
        for message, sent in zip(messages, sends, strict=True):
            try:
                await sent
                results.append((message, None))
            except RunwireError as exc:
                results.append((message, exc))
        return results

    async def dispatch(self, *runs: Run | None) -> Dispatched:
        """Publish what the transitions that returned `runs` implied and was due at once:
        the messages a run came back with, at once; those of the others' transactions,
        looked up in the outbox.

        Nothing is raised for a message that could not be published: the sweep publishes
        it after the grace (a full queue is reported in the result).
        """
        known = [r for r in runs if r is not None and r.messages is not None]
        xacts = {
            r.xact for r in runs if r is not None and r.messages is None and r.xact is not None
        }
        # A transaction that is looked up anyway brings its runs' messages with it.
        given = [m for r in known if r.xact not in xacts for m in r.messages or []]
        report = Dispatched()
        if given:
            await faults.point(faults.OUTBOX_COMMITTED)
            self._left_for_sweep(self._report(await self._publish_all(given), report))
        if xacts:
            report.queue_full.extend((await self._dispatch(xacts)).queue_full)
        return report

    async def dispatch_xact(self, xact: str | None) -> Dispatched:
        """`dispatch` for a transaction known by its id."""
        return await self._dispatch({xact} if xact is not None else set())

    async def _dispatch(self, xacts: set[str]) -> Dispatched:
        report = Dispatched()
        if not xacts:
            return report
        loop = asyncio.get_running_loop()
        for xact in xacts - self._waiting.keys():
            self._waiting[xact] = loop.create_future()
        waiting = [self._waiting[xact] for xact in xacts]
        if self._dispatcher is None or self._dispatcher.done():
            self._dispatcher = asyncio.create_task(self._dispatch_waiting())
        for done in await asyncio.gather(*waiting):
            report.queue_full.extend(done.queue_full)
        return report

    async def _dispatch_waiting(self) -> None:
        """Publish the rows of every transaction waiting, a batch at a time: under load,
        one query finds the rows of many transitions (the latency of a lone one is that
        of one query)."""
        while self._waiting:
            batch, self._waiting = self._waiting, {}
            reports = {xact: Dispatched() for xact in batch}
            try:
                await self._dispatch_batch(reports)
            finally:
                for xact, waiter in batch.items():
                    if not waiter.done():
                        waiter.set_result(reports[xact])

    async def _dispatch_batch(self, reports: dict[str, Dispatched]) -> None:
        await faults.point(faults.OUTBOX_COMMITTED)
        try:
            found = await self.store.outbox_of(list(reports))
        except RunwireError as exc:
            log.warning("messages of %d transitions left for the sweep: %s", len(reports), exc)
            return
        of_xact = {m.id: xact for xact, messages in found.items() for m in messages}
        messages = sorted((m for ms in found.values() for m in ms), key=lambda m: m.id)
        by_xact: dict[str, list[tuple[OutboxMessage, RunwireError | None]]] = {}
        for message, error in await self._publish_all(messages):
            by_xact.setdefault(of_xact[message.id], []).append((message, error))
        failed = [self._report(published, reports[xact]) for xact, published in by_xact.items()]
        self._left_for_sweep(next((f for f in failed if f is not None), None))

    def _report(
        self, published: list[tuple[OutboxMessage, RunwireError | None]], report: Dispatched
    ) -> RunwireError | None:
        """Note what was published (deleted soon) and what a full queue refused; returns
        the first other failure."""
        failed: RunwireError | None = None
        for message, error in published:
            if error is None:
                self._published.append(message.id)
            elif isinstance(error, QueueFull) and message.kind == OutboxKind.JOB:
                report.queue_full.append(message.run_id)
            else:
                failed = failed or error
        self._schedule_delete()
        return failed

    @staticmethod
    def _left_for_sweep(failed: RunwireError | None) -> None:
        if failed is not None:
            log.warning("messages of a transition left for the sweep: %s", failed.message)

    def _schedule_delete(self) -> None:
        if self._published and (self._deleter is None or self._deleter.done()):
            self._deleter = asyncio.create_task(self._delete_published())

    async def _delete_published(self) -> None:
        """Delete published rows in one statement every DELETE_EVERY_S while there are
        any. A row not deleted (a crash) is published again by the sweep: stored once."""
        while self._published:
            await asyncio.sleep(DELETE_EVERY_S)
            ids, self._published = self._published, []
            try:
                await self.store.outbox_delete(ids)
            except RunwireError as exc:
                log.warning("published outbox rows not deleted yet: %s", exc.message)
                self._published.extend(ids)

    async def close(self) -> None:
        """Delete what was published before the process goes (a row left is published
        again by the sweep, and stored once)."""
        if self._deleter is not None:
            await self._deleter
        if self._published:
            try:
                await self.store.outbox_delete(self._published)
            except RunwireError as exc:
                log.warning("published outbox rows left for the sweep: %s", exc.message)
            self._published = []

    def _traced(self, message: OutboxMessage) -> OutboxMessage:
        """A job the sweep publishes gets an "outbox publish" span in its run's trace (the
        attempt it starts descends from it), so a trace shows how long the job waited."""
        if message.kind != OutboxKind.JOB:
            return message
        with tracing.span(
            "outbox publish",
            tracing.context_of(message.trace_parent),
            kind=SpanKind.PRODUCER,
            attributes=tracing.run_attributes(message.run_id, message.tenant),
        ):
            traceparent = tracing.current_traceparent()
        return dataclasses.replace(message, trace_parent=traceparent or message.trace_parent)

    async def sweep(self, grace_ms: int, limit: int = SWEEP_BATCH) -> int:
        """Publish the sweep's due rows, oldest first; returns how many were published.

        A row that fails stays for the next sweep (a job refused by a full queue waits
        for room: back-pressure, not a failure of the run)."""
        async with self.store.outbox_due(grace_ms, limit) as batch:
            failed: RunwireError | None = None
            messages = [self._traced(m) for m in batch.messages]
            for message, error in await self._publish_all(messages):
                if error is None:
                    batch.published.append(message)
                else:
                    failed = failed or error
            if failed is not None:
                log.warning("outbox rows not published yet: %s", failed.message)
            if batch.published:
                await faults.point(faults.OUTBOX_SWEPT)
        return len(batch.published)
