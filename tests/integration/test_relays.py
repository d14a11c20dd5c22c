"""Several relays at once: each run's frames in order, none published twice."""

import asyncio
import json
import uuid
from datetime import UTC, datetime

import asyncpg
import pytest
from nats.aio.msg import Msg

from runwire.contracts.frames import FrameType, RawFrame
from runwire.contracts.status import RunStatus
from runwire.contracts.subjects import Subjects
from runwire.relay.partitions import PARTITION_LOCKS
from runwire.relay.pipeline import RAW_FRAME_ACK_WAIT_S, Pipeline
from runwire.runtime.broker import Broker
from runwire.runtime.settings import RelaySettings
from runwire.runtime.store import Segment, SegmentCount
from runwire.runtime.streams import RELAY_PARTITIONS, StreamLimits, relay_consumer
from runwire.runtime.tokens import frame_token
from runwire.testing.servers import Servers
from runwire.testing.waiting import eventually
from tests.services import InProcessStack, assert_well_formed, collect

pytestmark = pytest.mark.integration


async def _partitions_by_relay(db_url: str) -> list[int]:
    conn = await asyncpg.connect(db_url)
    try:
        rows = await conn.fetch(
            "SELECT pid, count(*) AS n FROM pg_locks WHERE locktype = 'advisory'"
            " AND granted AND classid = $1::integer::oid"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " GROUP BY pid",
            PARTITION_LOCKS,
        )
    finally:
        await conn.close()
    return sorted(r["n"] for r in rows)


async def test_two_relays_share_partitions_and_keep_every_run_in_order(
    stack: InProcessStack,
) -> None:
    stack.start_relay("relay-2")
    half = RELAY_PARTITIONS // 2
    await eventually(lambda: _shared(stack.db_url, [half, half]), timeout=15, interval=0.2)
    scripts = [{"tokens": [f"{i}/{t} " for t in range(40)], "token_delay_ms": 5} for i in range(12)]
    ids = [(await stack.client.submit(s)).run.run_id for s in scripts]

    results = await asyncio.gather(*(collect(stack.client, r, timeout=60) for r in ids))

    for i, (frames, transcript) in enumerate(results):
        assert_well_formed(frames)
        assert transcript.text == "".join(scripts[i]["tokens"])  # type: ignore[arg-type]


async def test_new_runs_are_relayed_without_reading_their_frames_back(
    stack: InProcessStack,
) -> None:
    """The first frame of a run's first attempt, delivered for the first time, needs no
    look at the run's last published frame: nothing of it can be there yet (Postgres
    says so). Each look is a JetStream API request; a chat product starts many runs."""
    looks: list[str] = []

    async def seen(msg: Msg) -> None:
        looks.append(msg.subject)

    stream = Subjects(stack.prefix).run_frames_stream
    spy = await stack.client.nc.subscribe(f"$JS.API.STREAM.MSG.GET.{stream}", cb=seen)
    try:
        scripts = [{"tokens": [f"{i}.{t} " for t in range(3)]} for i in range(6)]
        for script in scripts:
            run_id = (await stack.client.submit(script)).run.run_id
            frames, transcript = await collect(stack.client, run_id)
            assert_well_formed(frames)
            assert transcript.text == "".join(script["tokens"])
        await stack.client.nc.flush()
    finally:
        await spy.unsubscribe()
    assert looks == []


async def _shared(db_url: str, expected: list[int]) -> bool:
    return await _partitions_by_relay(db_url) == expected


async def test_a_stopped_relay_hands_its_partitions_over_mid_stream(
    stack: InProcessStack,
) -> None:
    stack.start_relay("relay-2")
    half = RELAY_PARTITIONS // 2
    await eventually(lambda: _shared(stack.db_url, [half, half]), timeout=15, interval=0.2)
    scripts = [{"tokens": [f"{i}|{t} " for t in range(60)], "token_delay_ms": 20} for i in range(8)]
    ids = [(await stack.client.submit(s)).run.run_id for s in scripts]
    streams = [asyncio.create_task(collect(stack.client, r, timeout=60)) for r in ids]
    await eventually(lambda: _started(stack, ids), timeout=15)

    await stack.stop_service("relay-2")
    results = await asyncio.gather(*streams)

    # The relay left takes every partition (at its next rebalance, on a busy machine).
    await eventually(lambda: _shared(stack.db_url, [RELAY_PARTITIONS]), timeout=15, interval=0.2)
    for i, (frames, transcript) in enumerate(results):
        assert_well_formed(frames)
        assert transcript.text == "".join(scripts[i]["tokens"])  # type: ignore[arg-type]


async def _started(stack: InProcessStack, ids: list[str]) -> bool:
    for run_id in ids:
        if len((await stack.client.join(run_id, 0)).replay) < 3:
            return False
    return True


@pytest.mark.parametrize("stale_last", [7, 10], ids=["some of them", "all of them"])
@pytest.mark.stack(coalesce_text=False)  # one frame per delta, as the test counts them
async def test_a_repair_that_meets_a_stale_relays_write_still_stores_every_frame_once(
    stack: InProcessStack, db_url: str, stale_last: int
) -> None:
    """The partition's new owner repairs a run's missing frames from the stream while the
    relay that lost the partition, woken from a freeze, writes some or all of them: the
    repair's segment that overlaps is left out, so it looks again and repairs what is
    left, and the run's frames are complete even when the stale write held the last."""
    reply = await stack.client.submit({"tokens": [f"t{i} " for i in range(12)]})
    run_id = reply.run.run_id
    frames, _ = await collect(stack.client, run_id)
    await eventually(lambda: _frames_closed(stack, run_id), timeout=10)
    last = len(frames)
    # Frames 5 to 10 never reached a segment (their relay was frozen, then lost the
    # partition); the new owner wrote the rest, `done` among them.
    conn = await asyncpg.connect(db_url)
    try:
        stored = await conn.fetch(
            "SELECT frames::text AS frames FROM frame_segments WHERE run_id = $1"
            " ORDER BY first_seq",
            uuid.UUID(run_id),
        )
        await conn.execute("DELETE FROM frame_segments WHERE run_id = $1", uuid.UUID(run_id))
        await conn.execute(
            "UPDATE runs SET frame_count = 0, frames_closed = false WHERE run_id = $1",
            uuid.UUID(run_id),
        )
    finally:
        await conn.close()
    bodies = [json.dumps(f) for row in stored for f in json.loads(row["frames"])]
    await stack.store.insert_segments(
        [
            Segment(run_id, 1, 4, 0, bodies[:4], closed=False),
            Segment(run_id, 11, last, 0, bodies[10:], closed=True),
        ]
    )

    broker = await Broker.connect(stack.nats_url, Subjects(stack.prefix), name="test-relay")
    pipeline = Pipeline(stack.settings(RelaySettings, "relay"), stack.store, broker)
    ranges = stack.store.segment_ranges

    looks: list[int] = []

    async def stale_write_after_reading(of_run: str) -> list[tuple[int, int, int]]:
        found = await ranges(of_run)
        looks.append(len(found))
        if len(looks) == 1:  # right after the repair's first look, the stale relay writes
            stale = Segment(run_id, 5, stale_last, 0, bodies[4:stale_last], closed=False)
            await stack.store.insert_segments([stale])
        return found

    stack.store.segment_ranges = stale_write_after_reading  # type: ignore[method-assign]
    try:
        count = SegmentCount(run_id, "default", last, 4 + last - 10, True)
        await pipeline.segments.repair(count)
    finally:
        stack.store.segment_ranges = ranges  # type: ignore[method-assign]
        await broker.close()

    run = await stack.store.get_run_by_id(run_id)
    assert run is not None
    assert (run.frames_closed, run.frame_count, run.last_seq) == (True, last, last)
    # Its segment 5..10 was left out: it looked again for what the stale write left.
    assert looks == ([2, 3] if stale_last < 10 else [2])
    # Purged from the stream, the run is read whole from Postgres, each frame once.
    await stack.client.nc.jetstream().purge_stream(
        stack.client.subjects.run_frames_stream,
        subject=stack.client.subjects.run_frames("default", run_id),
    )
    again = await stack.client.join(run_id, 0)
    assert [f.seq for f in again.replay] == list(range(1, last + 1))


async def _frames_closed(stack: InProcessStack, run_id: str) -> bool:
    row = await stack.store.get_run_by_id(run_id)
    return bool(row and row.frames_closed)


async def test_an_attempts_frames_stored_after_its_later_ones_all_reach_the_client(
    infra: Servers, db_url: str, prefix: str
) -> None:
    """A second attempt's first publishes fail (a JetStream leader election) and are
    retried after its next frames were stored: the stream holds frames 3..5 of its
    generation ahead of 1 and 2. The relay waits for them (they are in the stream) and
    keeps every frame, in order; before, the first frame waited on the later ones ("an
    older frame is still stored") while they waited on it, until the relay gave up on
    frames 1 and 2 and the run lost them."""
    stack = InProcessStack(infra.nats_url, db_url, prefix, db_roles=infra.service_roles)
    await stack.start(executors=0)
    broker = await Broker.connect(stack.nats_url, Subjects(stack.prefix), name="test-executor")
    try:
        reply = await stack.client.submit({"tokens": ["unused"]})
        run_id = reply.run.run_id
        # A first attempt that dies at once; recovery gives the run back to the queue.
        first = await eventually(lambda: stack.store.claim(run_id, 0, "ghost", 200))
        await eventually(lambda: _status(stack, run_id, RunStatus.RECOVERING), timeout=10)
        second = await eventually(lambda: stack.store.claim(run_id, first.generation, "b", 60_000))
        assert second.frame_secret is not None
        token = frame_token(second.frame_secret, second.generation)
        texts = ["a ", "b ", "c ", "d ", "e "]

        def raw(seq: int, type_: FrameType, data: dict[str, object]) -> RawFrame:
            return RawFrame(
                run_id=run_id,
                tenant="default",
                generation=second.generation,
                seq=seq,
                type=type_,
                data=data,
                at=datetime.now(UTC),
                token=token,
            )

        frames = [raw(1, FrameType.RUN, {"attempt": 2, "resumed": True, "partial_length": 0})]
        frames += [raw(i + 2, FrameType.MESSAGE, {"text": t}) for i, t in enumerate(texts)]
        frames.append(raw(len(frames) + 1, FrameType.DONE, {"status": "finished"}))
        for frame in frames[3:-1] + frames[:3] + frames[-1:]:  # 4..6, then 1..3, then done
            await broker.publish_raw_frame(frame)

        got, transcript = await collect(stack.client, run_id, timeout=30)
    finally:
        await broker.close()
        await stack.close()
    assert_well_formed(got)
    assert [f.type for f in got] == [f.type for f in frames]
    assert transcript.text == "".join(texts)


async def _status(stack: InProcessStack, run_id: str, status: RunStatus) -> bool:
    run = await stack.store.get_run_by_id(run_id)
    return run is not None and run.status == status


async def test_a_relay_that_stops_relaying_a_partition_gives_back_the_frames_in_hand(
    infra: Servers, db_url: str, prefix: str
) -> None:
    """Raw frames a relay had taken when it learnt that the partition is no longer its
    own (rebalanced to another relay, or its locks lapsed while it was frozen) go back at
    once, for the partition's next owner: none waits out its ack_wait, a stall of every
    run of the partition. (No store is needed: nothing is relayed.)"""
    subjects = Subjects(prefix)
    settings = RelaySettings(
        nats_url=infra.nats_url,
        database_url=db_url,
        prefix=prefix,
        stream_replicas=infra.stream_replicas,
    )
    broker = await Broker.connect(infra.nats_url, subjects, name="test-relay")
    try:
        await broker.ensure_streams(StreamLimits.of(settings))
        run_id = str(uuid.uuid4())
        frame = RawFrame(
            run_id=run_id,
            tenant="default",
            generation=1,
            seq=1,
            type=FrameType.RUN,
            data={"attempt": 1, "resumed": False, "partial_length": 0},
            at=datetime.now(UTC),
            token="t",
        )
        await broker.publish_raw_frame(frame)
        stored = await broker.js.get_last_msg(
            subjects.frames_in_stream, f"{subjects.frames_in('default', run_id)}.*"
        )
        partition = int(stored.subject.rsplit(".", 1)[-1])

        pipeline = Pipeline(settings, None, broker)  # type: ignore[arg-type]

        async def lost(stop: asyncio.Event) -> bool:
            return False  # the partition went elsewhere while its batch was fetched

        pipeline._still_owner = lost  # type: ignore[method-assign]
        await asyncio.wait_for(pipeline._consume(partition, asyncio.Event()), 10)

        # The partition's next owner gets the frame now, well inside its ack_wait.
        nxt = await broker.js.pull_subscribe_bind(
            relay_consumer(partition), stream=subjects.frames_in_stream
        )
        (again,) = await nxt.fetch(1, timeout=RAW_FRAME_ACK_WAIT_S / 2)
        assert again.metadata.num_delivered == 2
        assert RawFrame.model_validate_json(again.data).run_id == run_id
    finally:
        await broker.close()
