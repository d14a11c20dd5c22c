"""The pull consumer under the executor's jobs and the relay's archive of frames: a trickle of
messages over one open request, and nothing held back when it stops."""

import asyncio
from collections.abc import AsyncIterator

import pytest
from nats.aio.msg import Msg
from nats.js.api import StreamConfig

from runwire.contracts.subjects import Subjects
from runwire.runtime.broker import Broker
from runwire.runtime.consumer import DurablePull
from runwire.runtime.streams import StreamLimits
from runwire.testing.servers import Servers
from runwire.testing.waiting import eventually

pytestmark = pytest.mark.integration

DURABLE = "d"
# Far longer than any wait below: a message held by a consumer that went away would
# only come back after it.
ACK_WAIT_S = 30.0


@pytest.fixture
async def broker(infra: Servers, prefix: str) -> AsyncIterator[Broker]:
    broker = await Broker.connect(infra.nats_url, Subjects(prefix), name="test-consumer")
    await broker.js.add_stream(
        StreamConfig(
            name=f"{prefix}_T", subjects=[f"{prefix}_t.>"], num_replicas=infra.stream_replicas
        )
    )
    try:
        yield broker
    finally:
        await broker.js.delete_stream(f"{prefix}_T")
        await broker.close()


@pytest.fixture
async def requests(broker: Broker, prefix: str) -> AsyncIterator[list[Msg]]:
    """The pull requests sent for the test's consumer, as the server receives them."""
    seen: list[Msg] = []

    async def record(msg: Msg) -> None:
        seen.append(msg)

    spy = await broker.nc.subscribe(f"$JS.API.CONSUMER.MSG.NEXT.{prefix}_T.{DURABLE}", cb=record)
    await broker.nc.flush()
    try:
        yield seen
    finally:
        await spy.unsubscribe()


async def _pull(broker: Broker, prefix: str) -> DurablePull:
    pull = DurablePull(
        broker,
        f"{prefix}_T",
        DURABLE,
        # runwire's own streams, declared again with the consumer when it is gone.
        limits=StreamLimits(queue_capacity=1000, frame_max_age_s=3600),
        max_ack_pending=64,
        ack_wait_s=ACK_WAIT_S,
        declare_streams=False,
    )
    await pull.open()
    return pull


async def test_a_trickle_of_messages_comes_over_one_pull_request(
    broker: Broker, prefix: str, requests: list[Msg]
) -> None:
    """Messages that come one at a time to a waiting consumer are delivered over the
    request it left open, not one request (and a "no messages" answer) each."""
    pull = await _pull(broker, prefix)
    stop = asyncio.Event()
    try:
        for i in range(10):
            await broker.js.publish(f"{prefix}_t.x", f"m{i}".encode())
            msgs = await pull.fetch(64, stop)
            assert msgs is not None
            assert [m.data for m in msgs] == [f"m{i}".encode()]
            await msgs[0].ack()
        await broker.nc.flush()
        # One request, and one more each time it expired (FETCH_WAIT_S) on a slow machine.
        assert 1 <= len(requests) <= 3, f"{len(requests)} pull requests for 10 messages"
    finally:
        stop.set()
        await pull.fetch(64, stop)


async def test_a_stopped_consumer_holds_back_nothing(
    broker: Broker, prefix: str, requests: list[Msg]
) -> None:
    """A message stored after a consumer stopped (its pull request was still open) goes to
    the next consumer at once, not after the acknowledgement wait."""
    first = await _pull(broker, prefix)
    stop = asyncio.Event()
    waiting = asyncio.create_task(first.fetch(64, stop))
    await eventually(lambda: requests)  # its request is open on the server
    stop.set()
    assert await waiting is None
    await broker.js.publish(f"{prefix}_t.x", b"after")
    second = await _pull(broker, prefix)
    msgs = await second.fetch(64, asyncio.Event())
    assert msgs is not None
    assert [m.data for m in msgs] == [b"after"]
    info = await broker.js.consumer_info(f"{prefix}_T", DURABLE)
    assert info.num_redelivered == 0
    await second.close()


async def test_a_deleted_consumer_is_declared_again_without_spinning(
    broker: Broker, prefix: str, requests: list[Msg]
) -> None:
    """The server refuses pull requests for a consumer deleted under the service: it backs
    off, declares the consumer again, and takes the messages stored meanwhile."""
    pull = await _pull(broker, prefix)
    stop = asyncio.Event()
    got: list[bytes] = []

    async def serve() -> None:
        while (msgs := await pull.fetch(64, stop)) is not None:
            for msg in msgs:
                got.append(msg.data)
                await msg.ack()

    serving = asyncio.create_task(serve())
    try:
        await eventually(lambda: requests)  # it waits on an open request
        await broker.js.delete_consumer(f"{prefix}_T", DURABLE)
        await broker.js.publish(f"{prefix}_t.x", b"meanwhile")
        await eventually(lambda: got == [b"meanwhile"], timeout=15)
        # Declared again within CHECK_EVERY_S; meanwhile a refused request every half
        # second at most, not a request per turn of the event loop.
        assert len(requests) < 30, f"{len(requests)} pull requests while the consumer was gone"
    finally:
        stop.set()
        await serving
