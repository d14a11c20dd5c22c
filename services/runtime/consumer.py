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

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from runwire.runtime.broker import Broker, StreamLimits

log = logging.getLogger(__name__)


def _status(msg: Msg) -> str | None:
    """The status of a JetStream control message (None: a message of the stream)."""
    return msg.headers.get("Status") if msg.headers else None


FETCH_WAIT_S = 1.0
# A `no_wait` pull request is answered at once; this bounds a lost answer.
ANSWER_WAIT_S = 1.0
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

    @staticmethod
    def _queued(sub: JetStreamContext.PullSubscription, batch: int) -> list[Msg]:
        """Up to `batch` messages already delivered to the subscription (no request)."""
        msgs: list[Msg] = []
        queue = sub._sub._pending_queue
        while len(msgs) < batch and not queue.empty():
            msg = queue.get_nowait()
            queue.task_done()  # taken: a drain of the subscription waits for none
            sub._sub._pending_size -= len(msg.data)
            if _status(msg) is None:  # a status left over from an earlier request: done
                msgs.append(msg)
        return msgs

    @staticmethod
    async def _available(sub: JetStreamContext.PullSubscription, batch: int) -> list[Msg]:
        """Up to `batch` messages the consumer holds now, without waiting for more: those
        already delivered to the subscription, then one `no_wait` pull request, which the
        server answers at once (with what it has, then a "no messages" status)."""
        msgs = DurablePull._queued(sub, batch)
        if len(msgs) == batch:
            return msgs
        queue = sub._sub._pending_queue
        request = {"batch": batch - len(msgs), "no_wait": True}
        await sub._nc.publish(sub._nms, json.dumps(request).encode(), sub._deliver)
        # Read straight from the subscription's queue: the answer comes as one burst, and
        # a timed wait per message (nats-py's next_msg) costs a task and a timer each.
        while len(msgs) < batch:
            if queue.empty():
                try:
                    msg = await asyncio.wait_for(queue.get(), ANSWER_WAIT_S)
                except TimeoutError:
                    break  # what comes later stays in the queue for the next fetch
            else:
                msg = queue.get_nowait()
            queue.task_done()
            sub._sub._pending_size -= len(msg.data)
            if _status(msg) is not None:
                break  # the end of the answer ("no messages", or a refusal)
            msgs.append(msg)
        return msgs

    @classmethod
    async def _fetch(cls, sub: JetStreamContext.PullSubscription, batch: int) -> list[Msg]:
        # What the consumer holds now, at once; when it holds nothing, wait for one (a
        # lingering request: it arrives as soon as it is stored) and take it with what
        # else reached the subscription, without asking again: a quiet consumer's message
        # is handled one round trip sooner, and under load the next fetch asks at once.
        # (nats-py's fetch(n) waits until n messages arrived or its timeout passed, which
        # would hold a trickle of messages back.)
        msgs = await cls._available(sub, batch)
        if msgs:
            return msgs
        msgs = await sub.fetch(1, timeout=FETCH_WAIT_S)
        if batch > 1:
            msgs += cls._queued(sub, batch - 1)
        return msgs

    async def fetch(self, batch: int, stop: asyncio.Event) -> list[Msg] | None:
        """Up to `batch` messages ([] after a quiet wait); None once `stop` is set."""
        if stop.is_set():
            return None
        try:
            await self._check()
        except (nats.errors.Error, nats.js.errors.Error, OSError) as exc:
            log.warning("cannot check consumer %s: %s", self.durable, exc)
            await asyncio.sleep(0.5)
            return []
        assert self._sub is not None
        fetch = asyncio.create_task(self._fetch(self._sub, batch))
        stopping = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({fetch, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if not fetch.done():
            fetch.cancel()
            with contextlib.suppress(asyncio.CancelledError, nats.errors.Error):
                await fetch
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
