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
import logging

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from runwire.runtime.broker import Broker, StreamLimits

log = logging.getLogger(__name__)

FETCH_WAIT_S = 1.0
TOP_UP_WAIT_S = 0.002
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
    async def _fetch(sub: JetStreamContext.PullSubscription, batch: int) -> list[Msg]:
        # nats-py's fetch(n) waits until n messages arrived or its timeout passed, which
        # would hold a trickle of frames for up to the whole timeout. So: wait for one,
        # then take whatever else is there already.
        msgs = await sub.fetch(1, timeout=FETCH_WAIT_S)
        if batch > 1:
            with contextlib.suppress(TimeoutError, nats.errors.TimeoutError):
                msgs += await sub.fetch(batch - 1, timeout=TOP_UP_WAIT_S)
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
