"""A run's frames in the frames stream, as executors and the outbox publish them: each
once, numbered after the last one stored, and an attempt fenced out by the stream
itself once a newer attempt or the run's end stored a frame (on a real nats-server)."""

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest

from runwire.contracts.frames import Frame, FrameType
from runwire.contracts.subjects import Subjects
from runwire.executor.frames import FrameSender
from runwire.runtime.broker import Broker
from runwire.runtime.errors import LostRace, Unavailable
from runwire.runtime.frame_chain import Placed, append, read_tail
from runwire.runtime.settings import ExecutorSettings
from runwire.runtime.streams import StreamLimits
from runwire.testing.servers import Servers
from runwire.testing.waiting import pace

pytestmark = pytest.mark.integration

TENANT = "acme"
RUN = "00000000-0000-4000-8000-000000000001"


@pytest.fixture
async def broker(infra: Servers, prefix: str) -> AsyncIterator[Broker]:
    broker = await Broker.connect(infra.nats_url, Subjects(prefix), name="test-frames")
    await broker.ensure_streams(StreamLimits(1000, 3600, infra.stream_replicas))
    try:
        yield broker
    finally:
        await broker.close()


def _settings(**overrides: Any) -> ExecutorSettings:
    return ExecutorSettings.model_validate(
        {"database_url": "postgresql://unused/x", "publish_patience_ms": 2000, **overrides}
    )


def _sender(broker: Broker, generation: int, fenced: list[int], **overrides: Any) -> FrameSender:
    return FrameSender(
        broker,
        _settings(**overrides),
        tenant=TENANT,
        run_id=RUN,
        generation=generation,
        traceparent=None,
        on_fenced=lambda: fenced.append(generation),
    )


async def _stored(broker: Broker) -> list[Frame]:
    """The run's frames as the stream holds them, read back through a consumer."""
    s = broker.subjects
    sub = await broker.js.subscribe(
        s.run_frames(TENANT, RUN), stream=s.run_frames_stream, ordered_consumer=True
    )
    frames: list[Frame] = []
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=0.5)
            except TimeoutError:
                return frames
            frames.append(Frame.model_validate_json(msg.data))
    finally:
        await sub.unsubscribe()


def _closing(generation: int, raw_seq: int, type: str, data: dict[str, Any]) -> dict[str, Any]:
    """A closing frame as Postgres writes it to the outbox."""
    return {
        "v": 1,
        "run_id": RUN,
        "tenant": TENANT,
        "generation": generation,
        "seq": raw_seq,
        "type": type,
        "data": data,
        "at": datetime.now(UTC).isoformat(),
    }


async def _nothing_archived(run_id: str) -> tuple[int, bool]:
    return (0, False)


async def test_an_attempts_frames_are_stored_once_in_order_and_its_deltas_join(
    broker: Broker,
) -> None:
    fenced: list[int] = []
    sender = _sender(broker, 1, fenced)
    await sender.start(0, fresh=True)
    sender.put(FrameType.RUN, {"attempt": 1, "resumed": False, "partial_length": 0}, True)
    for i in range(200):
        sender.put(FrameType.MESSAGE, {"text": f"{i} "}, True)
    await sender.sync()
    await sender.close()

    frames = await _stored(broker)
    assert [f.seq for f in frames] == list(range(1, len(frames) + 1))
    assert frames[0].type == FrameType.RUN
    text = "".join(f.data["text"] for f in frames[1:])
    assert text == "".join(f"{i} " for i in range(200)) == sender.text.getvalue()
    # One frame at a time: deltas emitted while one is on its way join the next.
    assert len(frames) < 100
    assert fenced == []


async def test_the_runs_end_stored_first_fences_the_attempt_out(broker: Broker) -> None:
    fenced: list[int] = []
    sender = _sender(broker, 1, fenced)
    await sender.start(0, fresh=True)
    sender.put(FrameType.RUN, {"attempt": 1, "resumed": False, "partial_length": 0}, True)
    await sender.sync()
    # Recovery ends the run (its attempt lost): the closing frames of the next generation.
    error = _closing(2, 1, "error", {"code": "INTERRUPTED", "message": "x", "retryable": False})
    done = _closing(2, 2, "done", {"status": "failed", "code": "INTERRUPTED"})
    assert await append(broker, error, _nothing_archived) == Placed.STORED
    assert await append(broker, done, _nothing_archived) == Placed.STORED
    # The attempt, not knowing, goes on: the stream refuses it.
    sender.put(FrameType.MESSAGE, {"text": "late"}, True)
    with pytest.raises(LostRace):
        await sender.sync()
    await sender.close()

    frames = await _stored(broker)
    assert [(f.seq, f.type) for f in frames] == [
        (1, FrameType.RUN),
        (2, FrameType.ERROR),
        (3, FrameType.DONE),
    ]
    assert fenced == [1]
    # The same closing frames again (the outbox's sweep after a crash): not stored twice.
    assert await append(broker, error, _nothing_archived) == Placed.SUPERSEDED
    assert await append(broker, done, _nothing_archived) == Placed.ALREADY
    assert len(await _stored(broker)) == 3


async def test_a_newer_attempt_goes_on_after_an_older_ones_late_frames(broker: Broker) -> None:
    fenced: list[int] = []
    old = _sender(broker, 1, fenced)
    await old.start(0, fresh=True)
    old.put(FrameType.RUN, {"attempt": 1, "resumed": False, "partial_length": 0}, True)
    await old.sync()
    # The newer attempt reads where the frames end; the older one, not yet fenced out in
    # Postgres' eyes, stores one more frame before the newer attempt's first.
    new = _sender(broker, 2, fenced)
    await new.start(0, fresh=False)
    old.put(FrameType.MESSAGE, {"text": "straggler"}, True)
    await old.sync()
    new.put(FrameType.RUN, {"attempt": 2, "resumed": True, "partial_length": 0}, True)
    await new.sync()
    # From then on the older attempt is refused.
    old.put(FrameType.MESSAGE, {"text": "after"}, True)
    with pytest.raises(LostRace):
        await old.sync()
    new.put(FrameType.MESSAGE, {"text": "ok"}, True)
    await new.sync()
    await old.close()
    await new.close()

    frames = await _stored(broker)
    assert [(f.seq, f.type, f.data.get("attempt", f.data.get("text"))) for f in frames] == [
        (1, FrameType.RUN, 1),
        (2, FrameType.MESSAGE, "straggler"),
        (3, FrameType.RUN, 2),
        (4, FrameType.MESSAGE, "ok"),
    ]
    assert fenced == [1]
    tail = await read_tail(broker, TENANT, RUN)
    assert (tail.seq, tail.generation, tail.raw_seq) == (4, 2, 2)


async def test_a_workflows_frames_wait_for_the_one_before(broker: Broker) -> None:
    node = {
        "node_id": "a",
        "slot": "a",
        "node_run_id": "n1",
        "action": "started",
        "status": "running",
        "attempt": 1,
    }
    second = _closing(1, 2, "node", node)
    with pytest.raises(Unavailable):
        await append(broker, second, _nothing_archived)  # the first is not stored yet
    assert await append(broker, _closing(1, 1, "node", node), _nothing_archived) == Placed.STORED
    assert await append(broker, second, _nothing_archived) == Placed.STORED
    assert await append(broker, second, _nothing_archived) == Placed.ALREADY
    assert [f.seq for f in await _stored(broker)] == [1, 2]


async def test_frames_go_on_from_the_archived_seq_when_the_stream_holds_none(
    broker: Broker,
) -> None:
    async def archived(run_id: str) -> tuple[int, bool]:
        return (41, False)

    done = _closing(3, 1, "done", {"status": "canceled"})
    assert await append(broker, done, archived) == Placed.STORED
    assert [(f.seq, f.type) for f in await _stored(broker)] == [(42, FrameType.DONE)]


async def test_a_held_delta_waits_for_later_ones_but_a_first_delta_goes_at_once(
    broker: Broker,
) -> None:
    sender = _sender(broker, 1, [], coalesce_ms=300)
    await sender.start(0, fresh=True)
    sender.put(FrameType.RUN, {"attempt": 1, "resumed": False, "partial_length": 0}, True)
    sender.put(FrameType.MESSAGE, {"text": "a"}, True)  # the first after `run`: at once
    await pace(0.1, "the first delta's frame is stored meanwhile")
    for text in ("b", "c", "d"):
        sender.put(FrameType.MESSAGE, {"text": text}, True)
        await pace(0.02, "a runner's pace")
    tail = await read_tail(broker, TENANT, RUN)  # "b", "c" and "d" still held
    assert (tail.seq, tail.type) == (2, FrameType.MESSAGE.value)
    await sender.sync()
    await sender.close()
    assert [f.data.get("text") for f in await _stored(broker)] == [None, "a", "bcd"]
