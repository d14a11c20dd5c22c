"""Join and re-join: every frame after a cursor exactly once, during and after a run."""

import asyncio
import uuid

import pytest
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from runwire.client import Client
from runwire.client.follow import FRESH_IDLE_S
from runwire.contracts.commands import JoinCommand
from runwire.contracts.frames import Frame, FrameType
from runwire.contracts.headers import REPLAY_NEXT
from runwire.contracts.status import RunStatus
from runwire.contracts.subjects import Subjects
from runwire.relay.join import FIRST_SEGMENTS
from runwire.runtime.broker import Broker
from runwire.runtime.metrics import COMMAND_DURATION
from runwire.testing.servers import Servers
from runwire.testing.waiting import eventually
from tests.services import (
    AttemptFrames,
    InProcessStack,
    all_frames_stored,
    assert_well_formed,
    collect,
    stack_without_executor,
)

pytestmark = pytest.mark.integration


async def test_join_from_zero_after_the_end_replays_everything(stack: InProcessStack) -> None:
    reply = await stack.client.submit({"tokens": ["a", "b", "c"]})
    frames, _ = await collect(stack.client, reply.run.run_id)

    joined = await stack.client.join(reply.run.run_id, 0)

    assert joined.live is None  # ended, and the replay is complete
    assert [f.seq for f in joined.replay] == [f.seq for f in frames]
    assert joined.replay[-1].type == FrameType.DONE


async def test_join_from_a_cursor_after_the_end(stack: InProcessStack) -> None:
    reply = await stack.client.submit({"tokens": ["a", "b", "c", "d"]})
    frames, _ = await collect(stack.client, reply.run.run_id)

    rest, _ = await collect(stack.client, reply.run.run_id, after=3)

    assert_well_formed(rest, after=3)
    assert [f.model_dump() for f in rest] == [f.model_dump() for f in frames[3:]]


async def test_rejoin_mid_run_gets_each_frame_once(stack: InProcessStack) -> None:
    tokens = [f"t{i} " for i in range(40)]
    reply = await stack.client.submit({"tokens": tokens, "token_delay_ms": 10})
    run_id = reply.run.run_id
    seen: list[Frame] = []

    # Leave after a few frames, as a reloaded browser tab would.
    async for frame in stack.client.stream(run_id):
        seen.append(frame)
        if len(seen) == 8:
            break
    rest, _ = await collect(stack.client, run_id, after=seen[-1].seq)

    everything = seen + rest
    assert_well_formed(everything)
    text = "".join(f.data["text"] for f in everything if f.type == FrameType.MESSAGE)
    assert text == "".join(tokens)


@pytest.mark.stack(coalesce_text=False)  # one frame per delta, as the test counts them
async def test_join_under_a_fast_writer_has_no_gap(stack: InProcessStack) -> None:
    tokens = [f"{i}," for i in range(10_000)]
    reply = await stack.client.submit({"tokens": tokens})
    run_id = reply.run.run_id
    # Join while the run is writing as fast as it can, several times from several cursors.
    await eventually(lambda: _has_frames(stack, run_id, 50), timeout=20)
    results = await asyncio.gather(
        *(collect(stack.client, run_id, after=cursor, timeout=60) for cursor in (0, 10, 40))
    )
    for cursor, (frames, _) in zip((0, 10, 40), results, strict=True):
        assert_well_formed(frames, after=cursor)
    assert results[0][1].text == "".join(tokens)


async def _has_frames(stack: InProcessStack, run_id: str, n: int) -> bool:
    joined = await stack.client.join(run_id, 0)
    return len(joined.replay) >= n


async def test_cursor_beyond_the_last_seq_gives_empty_replay_then_live(
    stack: InProcessStack,
) -> None:
    reply = await stack.client.submit({"tokens": ["x"] * 30, "token_delay_ms": 30})
    run_id = reply.run.run_id
    await eventually(lambda: _has_frames(stack, run_id, 3), timeout=10)

    joined = await stack.client.join(run_id, 10_000)

    assert joined.replay == []
    assert joined.live is not None
    assert joined.live.subject.endswith(f".runs.{run_id}.frames")
    frames, _ = await collect(stack.client, run_id, after=20)
    assert_well_formed(frames, after=20)


async def test_join_after_the_stream_was_purged_is_served_from_postgres(
    stack: InProcessStack,
) -> None:
    reply = await stack.client.submit({"tokens": ["kept", " in", " postgres"]})
    run_id = reply.run.run_id
    frames, _ = await collect(stack.client, run_id)
    await eventually(lambda: _closed(stack, run_id), timeout=10)

    await _purge(stack.client, run_id)

    replayed, transcript = await collect(stack.client, run_id)
    assert [f.model_dump() for f in replayed] == [f.model_dump() for f in frames]
    assert transcript.text == "kept in postgres"
    middle, _ = await collect(stack.client, run_id, after=2)
    assert_well_formed(middle, after=2)


async def _purge(client: Client, run_id: str) -> None:
    """The run's frames removed from the client frames stream: joins read Postgres alone."""
    await client.nc.jetstream().purge_stream(
        client.subjects.run_frames_stream, subject=client.subjects.run_frames(client.tenant, run_id)
    )


async def _raw_join(client: Client, run_id: str, after: int) -> Msg:
    """A join's reply message as the relay sent it, headers and all."""
    command = JoinCommand(run_id=run_id, after=after).model_dump_json().encode()
    return await client.nc.request(
        client.subjects.command(client.tenant, "join"), command, timeout=5
    )


async def _closed(stack: InProcessStack, run_id: str) -> bool:
    row = await stack.store.get_run_by_id(run_id)
    return bool(row and row.frames_closed)


async def test_a_replay_over_its_size_limit_is_cut_and_the_rest_comes_by_joining_again(
    infra: Servers, db_url: str, prefix: str
) -> None:
    # One frame per delta: the replay is cut between frames of a few bytes each.
    async with InProcessStack(
        infra.nats_url, db_url, prefix, overrides={"replay_max_bytes": 4096, "coalesce_text": False}
    ) as small:
        tokens = [f"token-{i:04d} " for i in range(300)]
        reply = await small.client.submit({"tokens": tokens})
        frames, transcript = await collect(small.client, reply.run.run_id)
        assert transcript.text == "".join(tokens)
        await eventually(lambda: all_frames_stored(small.store, reply.run.run_id, len(frames)))

        first = await small.client.join(reply.run.run_id, 0)
        assert first.live is None  # cut: join again from the cursor
        assert 0 < len(first.replay) < len(frames)
        body = sum(len(f.model_dump_json()) for f in first.replay)
        assert body < 4096 + 200  # the limit, give or take the frame that crossed it
        # The reply says where the rest starts, in a header a client reads before the body.
        raw = await _raw_join(small.client, reply.run.run_id, 0)
        assert raw.headers is not None
        assert raw.headers[REPLAY_NEXT] == str(first.replay[-1].seq)
        again = await small.client.join(reply.run.run_id, first.replay[-1].seq)
        assert again.replay[0].seq == first.replay[-1].seq + 1
        # The SDK does the joining again by itself: every frame once, in order.
        streamed, _ = await collect(small.client, reply.run.run_id)
        assert [f.seq for f in streamed] == [f.seq for f in frames]

        # ... and asks for the rest while its caller still reads the first part.
        before = _joins_answered()
        reading = small.client.stream(reply.run.run_id)
        assert (await anext(reading)).seq == 1
        await eventually(lambda: _joins_answered() >= before + 2)
        await reading.aclose()
        # The last part of a replay names no rest.
        last = await _raw_join(small.client, reply.run.run_id, frames[-3].seq)
        assert REPLAY_NEXT not in (last.headers or {})


async def test_a_replay_of_many_segments_comes_whole_from_postgres_in_one_reply(
    infra: Servers, db_url: str, prefix: str
) -> None:
    # A segment every 10 ms of a paced run: many more than a join reads at first.
    async with InProcessStack(
        infra.nats_url, db_url, prefix, overrides={"segment_flush_ms": 10, "coalesce_text": False}
    ) as stack:
        tokens = [f"token-{i:04d} " for i in range(200)]
        reply = await stack.client.submit({"tokens": tokens, "token_delay_ms": 4})
        run_id = reply.run.run_id
        frames, _ = await collect(stack.client, run_id)
        await eventually(lambda: _closed(stack, run_id), timeout=10)
        assert len(await stack.store.segment_ranges(run_id)) > 3 * FIRST_SEGMENTS
        await _purge(stack.client, run_id)

        whole = await stack.client.join(run_id, 0)
        assert [f.model_dump() for f in whole.replay] == [f.model_dump() for f in frames]
        assert whole.live is None
        later = await stack.client.join(run_id, 150)
        assert [f.seq for f in later.replay] == [f.seq for f in frames if f.seq > 150]


def _joins_answered() -> float:
    """How many joins the relays of this process answered (their command histogram)."""
    for metric in COMMAND_DURATION.collect():
        for sample in metric.samples:
            if sample.name.endswith("_count") and sample.labels.get("command") == "join":
                return sample.value
    return 0.0


async def test_a_run_its_client_just_submitted_streams_without_asking_the_relay(
    stack: InProcessStack,
) -> None:
    before = _joins_answered()
    reply = await stack.client.submit({"tokens": ["straight", " from", " the stream"]})
    frames, transcript = await collect(stack.client, reply.run.run_id)

    assert_well_formed(frames)
    assert transcript.text == "straight from the stream"
    assert _joins_answered() == before  # followed in the stream from its first frame
    # Anyone else (or the same client again) joins, and gets the same frames.
    again, _ = await collect(stack.client, reply.run.run_id)
    assert [f.model_dump() for f in again] == [f.model_dump() for f in frames]
    assert _joins_answered() == before + 1


async def _followers_of(client: Client, run_id: str) -> list[str]:
    """The consumers of the run frames stream that read the run's subject."""
    subject = client.subjects.run_frames(client.tenant, run_id)
    consumers = await client.nc.jetstream().consumers_info(client.subjects.run_frames_stream)
    return [c.name for c in consumers if c.config.filter_subject == subject]


RUN_DATA = {"attempt": 1, "resumed": False, "partial_length": 0}


async def _follow(client: Client, run_id: str, frames: list[Frame], first: asyncio.Event) -> None:
    async for frame in client.stream(run_id):
        frames.append(frame)
        first.set()


async def test_a_run_its_client_just_submitted_is_followed_without_a_consumer(
    infra: Servers, db_url: str, prefix: str
) -> None:
    """The broker keeps nothing for a client following the run it just submitted: it
    listens on the run's live subject, where the stream republishes every frame it
    stores; a `run` frame stored before the client listened (an attempt that started at
    once) comes from the stream's last frame of the run. The test publishes the frames
    as an attempt does, so that each order is certain."""
    async with stack_without_executor(infra, db_url, prefix) as stack:
        broker = await Broker.connect(infra.nats_url, Subjects(prefix), name="test-executor")
        before = _joins_answered()
        try:
            for stored_first in (False, True):
                run_id = (await stack.client.submit({"tokens": ["x"]})).run.run_id
                attempt = AttemptFrames(broker, run_id)
                if stored_first:
                    await attempt.emit(FrameType.RUN, RUN_DATA)
                frames: list[Frame] = []
                first = asyncio.Event()
                following = asyncio.create_task(_follow(stack.client, run_id, frames, first))
                if not stored_first:
                    await attempt.emit(FrameType.RUN, RUN_DATA)
                await asyncio.wait_for(first.wait(), 10)
                followers = await _followers_of(stack.client, run_id)
                await attempt.run([f"t{i} " for i in range(5)])
                await asyncio.wait_for(following, 10)

                assert followers == [], stored_first
                assert_well_formed(frames)
                texts = [f.data.get("text") for f in frames[1:-1]]
                assert texts == [f"t{i} " for i in range(5)]
        finally:
            await broker.close()
        assert _joins_answered() == before


async def test_a_fresh_run_that_ended_before_it_was_followed_comes_whole_from_the_stream(
    stack: InProcessStack,
) -> None:
    """Nothing is published on the run's subject any more: its client finds its frames in
    the stream, without asking the relay."""
    reply = await stack.client.submit({"tokens": ["all", " done", " already"]})
    run_id = reply.run.run_id
    await eventually(lambda: _closed(stack, run_id), timeout=10)
    before = _joins_answered()

    frames, transcript = await collect(stack.client, run_id)

    assert_well_formed(frames)
    assert transcript.text == "all done already"
    assert _joins_answered() == before
    again, _ = await collect(stack.client, run_id)  # a join: the same frames
    assert [f.model_dump() for f in again] == [f.model_dump() for f in frames]


async def test_a_fresh_run_whose_frames_left_the_stream_is_joined_from_postgres(
    stack: InProcessStack, infra: Servers
) -> None:
    # A second client reads it first, so the submitter's own stream is its first.
    reply = await stack.client.submit({"tokens": ["gone", " from", " the stream"]})
    run_id = reply.run.run_id
    async with await Client.connect(infra.nats_url, prefix=stack.prefix, tenant="default") as other:
        frames, _ = await collect(other, run_id)
    await eventually(lambda: _closed(stack, run_id), timeout=10)
    await _purge(stack.client, run_id)

    replayed, transcript = await collect(stack.client, run_id)
    assert [f.model_dump() for f in replayed] == [f.model_dump() for f in frames]
    assert transcript.text == "gone from the stream"


async def _follow_live(client: Client, run_id: str) -> None:
    """What a client following a run live holds on the server: a consumer of the run
    frames stream filtered to the run (as `Client.stream` makes it)."""
    await client.nc.jetstream().add_consumer(
        client.subjects.run_frames_stream,
        ConsumerConfig(
            name=f"follow-{uuid.uuid4().hex}",
            filter_subject=client.subjects.run_frames(client.tenant, run_id),
            deliver_subject=client.nc.new_inbox(),
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=1,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=60.0,
            mem_storage=True,
            num_replicas=1,
        ),
    )


async def test_more_than_a_thousand_clients_follow_runs_live_at_once(
    stack: InProcessStack,
) -> None:
    # nats-server 2.15 refuses a stream's 1,001st consumer unless the stream allows more:
    # every client past the thousandth would have read by repeated joins instead.
    reply = await stack.client.submit({"tokens": ["a", "b"]})
    await collect(stack.client, reply.run.run_id)
    gate = asyncio.Semaphore(32)

    async def one() -> None:
        async with gate:
            await _follow_live(stack.client, reply.run.run_id)

    await asyncio.gather(*(one() for _ in range(1_001)))

    info = await stack.client.nc.jetstream().stream_info(stack.client.subjects.run_frames_stream)
    assert info.state.consumer_count >= 1_001


@pytest.mark.stack(max_frame_followers=3)
async def test_the_followers_limit_is_the_setting(stack: InProcessStack) -> None:
    reply = await stack.client.submit({"tokens": ["a"]})
    frames, _ = await collect(stack.client, reply.run.run_id)
    assert frames[-1].type == FrameType.DONE
    info = await stack.client.nc.jetstream().stream_info(stack.client.subjects.run_frames_stream)
    assert info.config.max_consumers == 3


@pytest.mark.stack(runners="asks=tests.waiting:asks", tenant_max_consumers=3)
async def test_a_client_following_runs_one_after_another_sees_each_resume_at_once(
    stack: InProcessStack,
) -> None:
    # Each run followed leaves its consumer on the server for a while after the client
    # stops reading (its inactive threshold), and counts toward the tenant's limit: the
    # fourth run's consumer, the one the client reads, was removed by recovery as it was
    # created, and the resumed attempt reached the client only when it joined again.
    client = stack.client
    run_ids = [(await client.submit({}, runner="asks")).run.run_id for _ in range(6)]

    async def all_waiting() -> bool:
        runs = [await client.get(run_id) for run_id in run_ids]
        return all(run.status == RunStatus.WAITING for run in runs)

    await eventually(all_waiting, timeout=20)
    loop = asyncio.get_running_loop()
    for run_id in run_ids:
        frames = client.stream(run_id)
        async for frame in frames:
            if frame.type == FrameType.WAIT:
                break
        began = loop.time()
        await client.resume(run_id, {"say": "yes"})
        first = await anext(frames)
        took = loop.time() - began
        assert first.type == FrameType.RUN
        # A frame the live consumer missed comes only after FRESH_IDLE_S and a join.
        assert took < FRESH_IDLE_S, f"run {run_ids.index(run_id) + 1}: {took:.2f} s"
        async for frame in frames:
            if frame.type == FrameType.DONE:
                break
