"""A durable pull consumer that survives the loss of its stream or consumer.

If the stream or the durable consumer is deleted on the server, a plain subscriber
goes silent with no error. This one checks the consumer every few seconds and
re-declares both from settings, so the service resumes by itself (Postgres still
holds every run; recovery re-publishes the jobs that were lost with the stream).

Our own code, not a FastStream subscriber: FastStream's pull subscriber binds to a
durable consumer without reconciling its configuration, goes silent when it is
deleted, and fetches on its own schedule; the executor fetches only as many jobs as it
has free slots (a fetched job's `ack_wait` runs from its delivery), and the relay starts
and stops one consumer per partition as it wins and loses the partition's lock.
"""

import asyncio
import contextlib
import json
import logging
from collections.abc import Sequence

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from runwire.runtime.broker import Broker
from runwire.runtime.streams import StreamLimits

log = logging.getLogger(__name__)


def _status(msg: Msg) -> str | None:
    """The status of a JetStream control message (None: a message of the stream)."""
    return msg.headers.get("Status") if msg.headers else None


# How long a pull request stays open on a quiet consumer.
FETCH_WAIT_S = 1.0
# Past its expiry, a request whose 408 status never came (lost in a reconnect) is taken
# for over.
EXPIRY_GRACE_S = 0.5
HEARTBEAT = "100"
# The status that ends a pull request at its expiry; any other ends it refused.
EXPIRED = "408"
# At most this many messages delivered but not yet taken are handed back on close.
MAX_LEFT = 10_000
CHECK_EVERY_S = 2.0


class DurablePull:
    """Fetches batches from one durable consumer until asked to stop."""

    def __init__(
        self,
        broker: Broker,
        stream: str,
        durable: str,
        *,
        limits: StreamLimits,
        max_ack_pending: int,
        ack_wait_s: float,
        filter_subject: str | None = None,
        declare_streams: bool = True,
    ) -> None:
        self.broker = broker
        self.declare_streams = declare_streams
        self.filter_subject = filter_subject
        self.stream = stream
        self.durable = durable
        self.limits = limits
        self.max_ack_pending = max_ack_pending
        self.ack_wait_s = ack_wait_s
        self._sub: JetStreamContext.PullSubscription | None = None
        self._checked_at = 0.0
        # What the open pull request may still deliver, and when it surely is over.
        self._open = 0
        self._open_until = 0.0
        # Why the server ended the last request early (None: it did not).
        self._refusal: str | None = None

    async def open(self) -> None:
        """Declare the streams and the consumer (create or reconcile), then bind."""
        if self.declare_streams:
            await self.broker.ensure_streams(self.limits)
        await self.broker.ensure_consumer(
            self.stream,
            self.durable,
            max_ack_pending=self.max_ack_pending,
            ack_wait_s=self.ack_wait_s,
            filter_subject=self.filter_subject,
        )
        if self._sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._sub.unsubscribe()
        self._sub = await self.broker.pull(self.stream, self.durable)
        self._open = 0
        self._checked_at = asyncio.get_running_loop().time()

    async def _check(self) -> None:
        loop = asyncio.get_running_loop()
        if loop.time() - self._checked_at < CHECK_EVERY_S:
            return
        self._checked_at = loop.time()
        try:
            await self.broker.js.consumer_info(self.stream, self.durable)
        except nats.js.errors.NotFoundError:
            log.warning("consumer %s on %s is gone; declaring it again", self.durable, self.stream)
            self.declare_streams = True  # the stream itself may be gone too
            await self.open()

    def _take(self, batch: int) -> list[Msg]:
        """Up to `batch` messages already delivered to the subscription (no request);
        a status on the way (the open request expired, or the server refused it) means
        the request is over."""
        assert self._sub is not None
        msgs: list[Msg] = []
        sub = self._sub._sub
        queue = sub._pending_queue
        while len(msgs) < batch and not queue.empty():
            msg = queue.get_nowait()
            queue.task_done()  # taken: a drain of the subscription waits for none
            sub._pending_size -= len(msg.data)
            self._count(msg, msgs)
        return msgs

    def _count(self, msg: Msg, msgs: list[Msg]) -> None:
        status = _status(msg)
        if status is None:
            msgs.append(msg)
            self._open = max(0, self._open - 1)
        elif status != HEARTBEAT:
            self._open = 0
            if status != EXPIRED:  # refused: the consumer is gone, no leader, ...
                told = msg.headers.get("Description", "") if msg.headers else ""
                self._refusal = f"{status} {told}".strip()

    async def _ask(self, batch: int) -> None:
        """Open a pull request for `batch` messages, good for FETCH_WAIT_S: the server
        delivers each message as it is stored, until the request has had `batch` or
        expires (then it sends a 408 status)."""
        assert self._sub is not None
        request = {"batch": batch, "expires": int(FETCH_WAIT_S * 1e9)}
        await self._sub._nc.publish(
            self._sub._nms, json.dumps(request).encode(), self._sub._deliver
        )
        self._open = batch
        self._open_until = asyncio.get_running_loop().time() + FETCH_WAIT_S + EXPIRY_GRACE_S

    async def _fetch(self, batch: int) -> list[Msg]:
        # One pull request stays open while the consumer is quiet, and each message
        # comes as soon as it is stored, with no request of its own; a request is sent
        # only when the last one had all it asked for or expired. So a trickle of
        # messages costs the server and this process one message each, not a request,
        # an answer and a "no messages" status each, and under load the messages that
        # arrive while a batch is handled are taken together by the next fetch.
        msgs = self._take(batch)
        if msgs:
            return msgs
        loop = asyncio.get_running_loop()
        if self._open == 0 or loop.time() >= self._open_until:
            await self._ask(batch)
        assert self._sub is not None
        queue = self._sub._sub._pending_queue
        while self._open > 0:
            wait = self._open_until - loop.time()
            if wait <= 0:
                self._open = 0  # its expiry status was lost (a reconnect)
                break
            try:
                # Straight from the subscription's queue: nats-py's next_msg costs a
                # task and a timer per message.
                msg = await asyncio.wait_for(queue.get(), wait)
            except TimeoutError:
                continue
            queue.task_done()
            self._sub._sub._pending_size -= len(msg.data)
            self._count(msg, msgs)
            if msgs:
                return msgs + self._take(batch - 1)
        if self._refusal is not None:
            # Raised, so that `fetch` waits a little and looks at the consumer first,
            # instead of asking again at once, over and over.
            refusal, self._refusal = self._refusal, None
            raise nats.js.errors.Error(f"pull request refused: {refusal}")
        return msgs

    async def close(self, unhandled: Sequence[Msg] = ()) -> None:
        """Stop taking messages: the open pull request goes with the subscription (the
        server drops a request nobody listens to), so what it would have delivered
        stays on the stream for whoever fetches next, instead of waiting out
        `ack_wait`. `unhandled`: messages fetched that the caller gives back too (a nak
        before the request is gone would only deliver them to it again)."""
        if self._sub is None:
            return
        left = [*unhandled, *self._take(MAX_LEFT)]
        sub, self._sub = self._sub, None
        self._open = 0
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()
            for msg in left:  # delivered but never handled: back to the stream now
                await msg.nak()

    async def fetch(self, batch: int, stop: asyncio.Event) -> list[Msg] | None:
        """Up to `batch` messages ([] after a quiet wait); None once `stop` is set (or
        after `close`)."""
        if stop.is_set() or self._sub is None:
            await self.close()
            return None
        try:
            await self._check()
        except (nats.errors.Error, nats.js.errors.Error, OSError) as exc:
            log.warning("cannot check consumer %s: %s", self.durable, exc)
            await asyncio.sleep(0.5)
            return []
        assert self._sub is not None
        fetch = asyncio.create_task(self._fetch(batch))
        stopping = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({fetch, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if not fetch.done():
            fetch.cancel()
            with contextlib.suppress(asyncio.CancelledError, nats.errors.Error):
                await fetch
            await self.close()
            return None
        try:
            return fetch.result()
        except (TimeoutError, nats.errors.TimeoutError):
            return []
        except (nats.errors.Error, nats.js.errors.Error, OSError) as exc:
            log.warning("fetching from %s failed: %s", self.durable, exc)
            self._checked_at = 0.0  # look at the consumer before the next fetch
            await asyncio.sleep(0.5)
            return []
