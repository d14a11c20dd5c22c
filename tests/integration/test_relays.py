"""The relay archives the frames stream: every frame an attempt stored, written to
Postgres segments once and in order, by one relay at a time."""

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StreamConfig

from runwire.contracts.frames import FrameType
from runwire.contracts.subjects import Subjects
from runwire.relay.archive import EARLIER_CONSUMER, Archiver
from runwire.relay.partitions import ARCHIVE_LOCKS, PRESENCE_LOCKS
from runwire.runtime.broker import Broker
from runwire.runtime.settings import RelaySettings
from runwire.runtime.store import Segment
from runwire.runtime.streams import StreamLimits
from runwire.testing.servers import Servers
from runwire.testing.waiting import eventually
from tests.services import (
    AttemptFrames,
    InProcessStack,
    all_frames_stored,
    archived_seqs,
    collect,
    stack_without_executor,
)
from tests.traces import InProcessSpans, of_run

pytestmark = pytest.mark.integration


@pytest.fixture
async def archive(infra: Servers, db_url: str, prefix: str) -> AsyncIterator[InProcessStack]:
    """Submitter, relay and recovery, no executor: the test publishes the frames."""
    async with stack_without_executor(infra, db_url, prefix) as stack:
        yield stack


@pytest.fixture
async def broker(archive: InProcessStack) -> AsyncIterator[Broker]:
    """A connection that publishes frames as an executor does."""
    connected = await Broker.connect(
        archive.nats_url, Subjects(archive.prefix), name="test-executor"
    )
    try:
        yield connected
    finally:
        await connected.close()


async def _runs(stack: InProcessStack, n: int) -> list[str]:
    """`n` runs in Postgres (queued: no executor takes them)."""
    return [(await stack.client.submit({"tokens": ["x"]})).run.run_id for _ in range(n)]


@contextlib.asynccontextmanager
async def _publishing(
    infra: Servers, db_url: str, prefix: str, **overrides: Any
) -> AsyncIterator[tuple[InProcessStack, Broker]]:
    """A stack without an executor (`overrides` its settings), and a connection that
    publishes frames as an executor does."""
    async with stack_without_executor(infra, db_url, prefix, **overrides) as stack:
        publisher = await Broker.connect(stack.nats_url, Subjects(prefix), name="test-executor")
        try:
            yield stack, publisher
        finally:
            await publisher.close()


async def _hearing_live(stack: InProcessStack, publisher: Broker) -> None:
    """Wait until the relay hears frames live: once a run's frames are archived, it has
    read the stream from where the archive stood (a relay still doing so syncs each run
    it finds there from the stream, in segments of its own, as designed)."""
    (warm,) = await _runs(stack, 1)
    await AttemptFrames(publisher, warm).run([])
    await eventually(lambda: all_frames_stored(stack.store, warm, 2), timeout=15)


async def _archived_once(stack: InProcessStack, run_id: str, frames: int) -> bool:
    return await all_frames_stored(stack.store, run_id, frames) and await archived_seqs(
        stack.store, run_id
    ) == list(range(1, frames + 1))


async def test_every_run_is_archived_once_in_order_and_closed_by_done(
    archive: InProcessStack, broker: Broker
) -> None:
    ids = await _runs(archive, 6)
    texts = [[f"{i}.{t} " for t in range(30)] for i in range(len(ids))]
    chains = [AttemptFrames(broker, run_id) for run_id in ids]
    # Interleaved, as concurrent attempts publish; no `done` yet.
    await asyncio.gather(*(c.run(t, done=False) for c, t in zip(chains, texts, strict=True)))

    for run_id, chain in zip(ids, chains, strict=True):
        await eventually(
            lambda r=run_id, n=chain.seq: _counted(archive, r, n), timeout=15, interval=0.05
        )
        run = await archive.store.get_run_by_id(run_id)
        assert run is not None
        assert not run.frames_closed  # no `done` yet

    await asyncio.gather(*(c.emit(FrameType.DONE, {"status": "finished"}) for c in chains))
    for run_id, chain in zip(ids, chains, strict=True):
        await eventually(lambda r=run_id, n=chain.seq: _archived_once(archive, r, n), timeout=15)
        # A join reads the run whole: from the stream and from Postgres alike.
        joined = await archive.client.join(run_id, 0)
        assert [f.seq for f in joined.replay] == list(range(1, chain.seq + 1))
        assert joined.live is None
        texts_back = "".join(f.data["text"] for f in joined.replay if f.type == FrameType.MESSAGE)
        assert texts_back == "".join(texts[ids.index(run_id)])
        # Once the stream no longer holds them, from Postgres alone.
        await broker.purge_subject(
            broker.subjects.run_frames_stream, broker.subjects.run_frames("default", run_id)
        )
        again = await archive.client.join(run_id, 3)
        assert [f.seq for f in again.replay] == list(range(4, chain.seq + 1))


async def _counted(stack: InProcessStack, run_id: str, frames: int) -> bool:
    run = await stack.store.get_run_by_id(run_id)
    return run is not None and run.frame_count == frames


async def test_each_flush_is_a_span_of_the_attempt_whose_frames_it_wrote(
    archive: InProcessStack, broker: Broker, spans: InProcessSpans
) -> None:
    await _hearing_live(archive, broker)
    (run_id,) = await _runs(archive, 1)
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    chain = AttemptFrames(broker, run_id, generation=3, traceparent=f"00-{trace_id}-{parent}-01")
    await chain.run(["a ", "b "])
    await eventually(lambda: _archived_once(archive, run_id, chain.seq), timeout=15)

    flushes = [s for s in of_run(spans.spans, run_id) if s.name == "relay flush"]
    assert flushes
    assert {(s.trace_id, s.parent_id, s.attributes["generation"]) for s in flushes} == {
        (trace_id, parent, 3)
    }
    assert sum(s.attributes["frames"] for s in flushes) == chain.seq


async def test_a_join_of_a_run_in_progress_continues_live_where_its_replay_ends(
    archive: InProcessStack, broker: Broker
) -> None:
    (run_id,) = await _runs(archive, 1)
    chain = AttemptFrames(broker, run_id)
    await chain.run(["a ", "b "], done=False)
    await eventually(lambda: _counted(archive, run_id, 3), timeout=10)
    await chain.emit(FrameType.MESSAGE, {"text": "c "})  # in the stream, maybe not archived

    joined = await archive.client.join(run_id, 1)

    assert [f.seq for f in joined.replay] == [2, 3, 4]
    assert joined.live is not None
    assert joined.live.subject == broker.subjects.run_frames("default", run_id)
    last = await broker.last_on_subject(joined.live.stream, joined.live.subject)
    assert last is not None
    assert joined.live.stream_seq == last.stream_seq + 1


async def test_frames_written_before_a_crash_are_not_written_again(
    archive: InProcessStack, broker: Broker
) -> None:
    """A relay wrote a run's first segment and died before it told Postgres how far the
    archive went: the next relay reads those frames again, with the ones it never wrote.
    What is written already is left as it is, and the rest is written once."""
    (run_id,) = await _runs(archive, 1)
    await archive.stop_service("relay")  # nothing archives while the stream fills
    chain = AttemptFrames(broker, run_id)
    await chain.run([f"t{i} " for i in range(8)])
    stored = await broker.read_subject(
        broker.subjects.run_frames_stream,
        broker.subjects.run_frames("default", run_id),
        1,
        chain.last_stream_seq,
    )
    bodies = [m.data.decode() for m in stored]
    await archive.store.insert_segments(
        [Segment(run_id, 1, 4, stored[3].stream_seq, bodies[:4], closed=False)]
    )

    archive.start_relay("relay-2")

    await eventually(lambda: _archived_once(archive, run_id, chain.seq), timeout=15)
    first = (await archive.store.segments_after(run_id, 0))[0]
    assert (first.first_seq, first.last_seq) == (1, 4)


async def test_an_archive_read_again_from_the_start_duplicates_nothing(
    archive: InProcessStack, broker: Broker, db_url: str
) -> None:
    """The archive's progress is lost (set back by an operator, or a database restored
    from an older backup): the relay that archives next reads the whole stream again.
    Runs archived already are left as they are; a run stored since is archived once."""
    first, second = await _runs(archive, 2)
    chain = AttemptFrames(broker, first)
    await chain.run(["a ", "b ", "c "])
    await eventually(lambda: _archived_once(archive, first, chain.seq), timeout=15)
    stream = broker.subjects.run_frames_stream
    await eventually(lambda: _archived_through(db_url, stream), timeout=15)

    await archive.stop_service("relay")
    await _set_archived_through(db_url, 0)
    archive.start_relay("relay-2")
    later = AttemptFrames(broker, second)
    await later.run(["d ", "e "])

    await eventually(lambda: _archived_once(archive, second, later.seq), timeout=15)
    assert await archived_seqs(archive.store, first) == list(range(1, chain.seq + 1))
    last = await broker.last_stream_seq(stream)
    assert await eventually(lambda: _archived_through(db_url, stream, last), timeout=15) == last


async def test_the_archive_goes_on_where_an_earlier_versions_consumer_stood(
    archive: InProcessStack, broker: Broker, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Relays of an earlier version kept the archive's place in a durable consumer of the
    stream, `relay-archive`, acknowledging each frame once written. The first relay of
    this version to archive starts after that consumer's acknowledged frames, keeps that
    place in Postgres, and removes the consumer."""
    caplog.set_level(logging.INFO, logger="runwire.relay.archive")
    await archive.stop_service("relay")
    await _forget_the_archive(db_url)
    first, second = await _runs(archive, 2)
    chain = AttemptFrames(broker, first)
    await chain.run(["a ", "b "])
    # The earlier version archived the first run, and acknowledged its frames.
    stream = broker.subjects.run_frames_stream
    js = broker.nc.jetstream()
    earlier = await js.pull_subscribe(
        broker.subjects.run_frames_wildcard,
        durable=EARLIER_CONSUMER,
        stream=stream,
        config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT),
    )
    taken = await earlier.fetch(chain.seq, timeout=10)
    await archive.store.insert_segments(
        [
            Segment(
                first,
                1,
                chain.seq,
                chain.last_stream_seq,
                [m.data.decode() for m in taken],
                closed=True,
            )
        ]
    )
    for msg in taken:
        await msg.ack_sync()
    later = AttemptFrames(broker, second)
    await later.run(["c "])

    archive.start_relay("relay-2")

    await eventually(lambda: _archived_once(archive, second, later.seq), timeout=15)
    assert await _archived_once(archive, first, chain.seq)
    assert f"from stream sequence {chain.last_stream_seq + 1} on" in caplog.text
    assert await broker.consumer_of(stream, EARLIER_CONSUMER) is None
    last = await broker.last_stream_seq(stream)
    assert await eventually(lambda: _archived_through(db_url, stream, last), timeout=15) == last


async def test_a_frames_stream_made_anew_is_archived_from_its_start(
    archive: InProcessStack, broker: Broker, db_url: str
) -> None:
    """The frames stream is removed and made again (an operator starting it over): it
    numbers its frames from 1 again. The relay that archives next sees a stream made at
    another time than the one its progress is about, and archives the new one from its
    start: a run whose frames all come before the old progress is archived too."""
    first, second, third = await _runs(archive, 3)
    before = AttemptFrames(broker, first)
    await before.run(["a ", "b ", "c ", "d "])
    await eventually(lambda: _archived_once(archive, first, before.seq), timeout=15)
    stream = broker.subjects.run_frames_stream
    old = await eventually(
        lambda: _archived_through(db_url, stream, before.last_stream_seq), timeout=15
    )
    await archive.stop_service("relay")
    assert await broker.delete_stream(stream)
    await broker.ensure_streams(StreamLimits.of(archive.settings(RelaySettings, "relay")))
    small = AttemptFrames(broker, second)
    await small.run(["x "])
    assert small.last_stream_seq < old  # all before the old progress
    big = AttemptFrames(broker, third)
    await big.run([f"{i} " for i in range(old)])  # and past it

    archive.start_relay("relay-2")

    await eventually(lambda: _archived_once(archive, third, big.seq), timeout=15)
    await eventually(lambda: _archived_once(archive, second, small.seq), timeout=15)


async def test_a_catch_up_through_more_bytes_than_one_read_holds_goes_on(
    archive: InProcessStack, broker: Broker
) -> None:
    """A relay that takes over reads what the stream stored since the archive's progress
    in batches that the server ends at a size: large frames (tool outputs of hundreds of
    kilobytes) fill a batch before its count, and the relay reads on after it."""
    await archive.stop_service("relay")
    (run_id,) = await _runs(archive, 1)
    chain = AttemptFrames(broker, run_id)
    await chain.run(["x" * 300_000 + f" {i}" for i in range(40)])  # 12 MB

    archive.start_relay("relay-2")

    await eventually(lambda: _archived_once(archive, run_id, chain.seq), timeout=30)


async def _archive_row(db_url: str, query: str, *args: object) -> Any:
    """One statement on the archive's progress (`frame_archive`), as the test's admin."""
    conn = await asyncpg.connect(db_url)
    try:
        return await conn.fetchval(query, *args)
    finally:
        await conn.close()


async def _set_archived_through(db_url: str, through: int) -> None:
    await _archive_row(db_url, "UPDATE frame_archive SET archived_through = $1", through)


async def _forget_the_archive(db_url: str) -> None:
    """No place of the archive in Postgres (as before this version)."""
    await _archive_row(db_url, "DELETE FROM frame_archive")


async def _archived_through(db_url: str, stream: str, at_least: int = 1) -> int | None:
    """How far Postgres says the frames stream is archived, once it is `at_least`."""
    through = await _archive_row(
        db_url, "SELECT archived_through FROM frame_archive WHERE stream = $1", stream
    )
    return through if through is not None and through >= at_least else None


async def _archived_to_the_end(stack: InProcessStack, broker: Broker) -> bool:
    """Whether Postgres says every frame the stream holds is archived (none held back)."""
    stream = broker.subjects.run_frames_stream
    last = await broker.last_stream_seq(stream)
    return await _archived_through(stack.db_url, stream, last) is not None


async def test_a_frame_whose_live_copy_was_lost_is_read_from_the_stream(
    archive: InProcessStack, broker: Broker
) -> None:
    """The archiver hears frames as the stream republishes them. One whose copy never
    reaches it (dropped on the way to a busy relay, lost in a leader change) is read from
    the stream: when a later frame, of any run, shows the gap; and, with no frame after
    it, when the archiver looks at the stream after a quiet while. Here an archiver is
    handed the stream's copies with those left out."""
    await archive.stop_service("relay")
    first, second, third = await _runs(archive, 3)
    copies: list[Msg] = []

    async def heard(msg: Msg) -> None:
        copies.append(msg)

    await broker.nc.subscribe(broker.subjects.live_frames_wildcard, cb=heard)
    chains = [AttemptFrames(broker, run_id) for run_id in (first, second, third)]
    for chain in chains:
        await chain.run(["a ", "b "])
    total = sum(chain.seq for chain in chains)
    await eventually(lambda: len(copies) == total, timeout=15)
    archiver = Archiver(archive.settings(RelaySettings, "relay"), archive.store, broker)
    archiver.through = await archiver._archive_start()
    stop = asyncio.Event()
    firsts, seconds = chains[0].seq, chains[0].seq + chains[1].seq

    # The first run's `done` is never heard; the second run's frames follow it.
    for msg in [*copies[: firsts - 1], *copies[firsts:seconds]]:
        await archiver._heard(msg, stop)
    await archiver.segments.flush()
    assert await _archived_once(archive, first, chains[0].seq)
    assert await _archived_once(archive, second, chains[1].seq)

    # The third run's last frame is never heard, and nothing comes after it.
    for msg in copies[seconds:-1]:
        await archiver._heard(msg, stop)
    await archiver._look_at_the_stream(stop)
    await archiver.segments.flush()
    assert await _archived_once(archive, third, chains[2].seq)
    assert archiver.through == await broker.last_stream_seq(broker.subjects.run_frames_stream)


async def test_frames_gone_from_the_stream_hold_the_archive_up_nowhere(
    archive: InProcessStack, broker: Broker
) -> None:
    """An archiver that reads the stream from an earlier place (a take-over, a restart)
    meets sequences whose frames are gone (a run's frames purged once archived): it
    goes on past them, the last of the stream included."""
    await archive.stop_service("relay")
    first, second = await _runs(archive, 2)
    chains = [AttemptFrames(broker, first), AttemptFrames(broker, second)]
    for chain in chains:
        await chain.run(["a ", "b "])
    stream = broker.subjects.run_frames_stream
    await broker.purge_subject(stream, broker.subjects.run_frames("default", second))
    archiver = Archiver(archive.settings(RelaySettings, "relay"), archive.store, broker)
    archiver.through = await archiver._archive_start()

    assert await archiver._catch_up(asyncio.Event())
    await archiver.segments.flush()
    assert archiver.through == await broker.last_stream_seq(stream)
    assert await _archived_once(archive, first, chains[0].seq)
    assert await archived_seqs(archive.store, second) == []


async def test_a_malformed_message_stops_no_archiving(
    archive: InProcessStack, broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    """Messages on the frames stream that are not frames (no position header, a body
    that is not a frame, a header that disagrees with the body) are logged with their run
    and left out; every frame around them is archived."""
    caplog.set_level(logging.ERROR, logger="runwire.relay.archive")
    bad_run, other = await _runs(archive, 2)
    chain, beside = AttemptFrames(broker, bad_run), AttemptFrames(broker, other)
    await chain.run(["a "], done=False)
    subject = broker.subjects.frames_out("default", bad_run)
    stream = broker.subjects.run_frames_stream
    bad = [
        (b'{"v": 1, "run_id": "' + bad_run.encode() + b'"}', {"Rw-Pos": "1 3 3 message"}),
        (b"not json at all", {"Rw-Pos": "1 3 3 message"}),
        (b"{}", {}),
    ]
    for i, (body, headers) in enumerate(bad):
        sent = await broker.send(subject, body, f"bad-{uuid.uuid4()}-{i}", stream, headers)
        chain.last_stream_seq = await sent  # stored on the run's subject all the same
    await beside.run(["x "], done=False)
    # A real frame whose position header says another seq.
    sent = await broker.send(
        subject,
        _frame_json(bad_run, chain.seq + 1),
        f"{bad_run}:1:x",
        stream,
        {"Rw-Pos": f"1 9 {chain.seq + 5} message"},
    )
    chain.last_stream_seq = await sent
    await chain.run(["b ", "c "])
    await beside.run(["y "])

    await eventually(lambda: _archived_once(archive, bad_run, chain.seq), timeout=15)
    await eventually(lambda: _archived_once(archive, other, beside.seq), timeout=15)
    await eventually(lambda: _archived_to_the_end(archive, broker), timeout=15)
    refused = [r for r in caplog.records if "malformed message" in r.getMessage()]
    assert len(refused) == len(bad) + 1
    assert all(r.__dict__["fields"]["run_id"] == bad_run for r in refused)


async def test_frames_under_another_tenants_subject_or_of_no_run_are_not_archived(
    archive: InProcessStack, broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    """A frame of a run published under another tenant's subject (a faulty or hostile
    publisher), and frames of a run Postgres does not have, are logged and left out:
    none reaches a segment, and the run's own frames are archived."""
    caplog.set_level(logging.ERROR, logger="runwire.relay")
    (run_id,) = await _runs(archive, 1)
    chain = AttemptFrames(broker, run_id)
    await chain.run(["a ", "b "], done=False)
    await eventually(lambda: _counted(archive, run_id, chain.seq), timeout=15)
    elsewhere = AttemptFrames(broker, run_id, tenant="acme", generation=7)
    elsewhere.seq = elsewhere.raw_seq = chain.seq
    await elsewhere.run(["for another tenant "], done=False)
    nobody = AttemptFrames(broker, str(uuid.uuid4()))
    nobody.seq = 4  # a run in progress, as a relay that takes over meets it
    await nobody.run(["lost "], done=False)
    await chain.run(["c "])

    await eventually(lambda: _archived_once(archive, run_id, chain.seq), timeout=15)
    await eventually(lambda: _archived_to_the_end(archive, broker), timeout=15)
    joined = await archive.client.join(run_id, 0)
    assert "for another tenant" not in "".join(f.data.get("text", "") for f in joined.replay)
    assert "under tenant acme's subject" in caplog.text
    assert "a run Postgres does not have" in caplog.text


def _frame_json(run_id: str, seq: int) -> bytes:
    return (
        f'{{"v":1,"run_id":"{run_id}","seq":{seq},"type":"message","data":{{"text":"?"}},'
        f'"at":"2026-12-06T00:00:00Z"}}'
    ).encode()


async def _relays(db_url: str, n: int) -> bool:
    return len(await _archive_holders(db_url, PRESENCE_LOCKS)) == n


async def _archive_holders(db_url: str, lock_class: int = ARCHIVE_LOCKS) -> list[int]:
    """The Postgres sessions that hold the archive lock (or another class of lock)."""
    conn = await asyncpg.connect(db_url)
    try:
        rows = await conn.fetch(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND classid = $1::integer::oid"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            lock_class,
        )
    finally:
        await conn.close()
    return sorted(r["pid"] for r in rows)


async def test_one_relay_archives_and_another_takes_over_when_it_stops(
    archive: InProcessStack, broker: Broker, db_url: str
) -> None:
    (holder,) = await eventually(lambda: _archive_holders(db_url), timeout=15)
    archive.start_relay("relay-2")
    ids = await _runs(archive, 4)
    chains = [AttemptFrames(broker, run_id) for run_id in ids]
    await asyncio.gather(*(c.run([f"{i} " for i in range(20)], done=False) for c in chains))
    # The second relay is up (it tried the lock in the same step as it took its presence
    # lock), answers joins, and does not archive: the lock stays where it was.
    await eventually(lambda: _relays(db_url, 2), timeout=15)
    for run_id, chain in zip(ids, chains, strict=True):
        await eventually(lambda r=run_id, n=chain.seq: _counted(archive, r, n), timeout=15)
    assert await _archive_holders(db_url) == [holder]

    await archive.stop_service("relay")
    (taken,) = await eventually(lambda: _archive_holders(db_url), timeout=15, interval=0.1)
    assert taken != holder
    await asyncio.gather(*(c.run(["last "]) for c in chains))

    for run_id, chain in zip(ids, chains, strict=True):
        await eventually(lambda r=run_id, n=chain.seq: _archived_once(archive, r, n), timeout=15)


async def test_a_relay_removes_the_empty_raw_frames_stream_of_an_earlier_version(
    infra: Servers, db_url: str, prefix: str
) -> None:
    subjects = Subjects(prefix)
    old = await Broker.connect(infra.nats_url, subjects, name="test-earlier-version")
    try:
        full, empty = f"{prefix}.frames.in.*.*", subjects.frames_in_stream
        await old.js.add_stream(
            StreamConfig(
                name=empty,
                subjects=[full],
                retention=RetentionPolicy.WORK_QUEUE,
                num_replicas=infra.stream_replicas,
            )
        )
        for partition in range(3):
            await old.ensure_consumer(
                empty,
                f"relay-{partition}",
                max_ack_pending=10,
                ack_wait_s=5,
                filter_subject=f"{prefix}.frames.in.t{partition}.*",
            )
        async with InProcessStack(
            infra.nats_url,
            db_url,
            prefix,
            executors=0,
            overrides={"stream_replicas": infra.stream_replicas},
        ):

            async def removed() -> bool:
                return await old.stream_messages(empty) is None

            await eventually(removed, timeout=15)
    finally:
        await old.close()


async def test_a_raw_frames_stream_that_holds_frames_is_left_for_the_earlier_version(
    infra: Servers, db_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="runwire.relay.upgrade")
    subjects = Subjects(prefix)
    old = await Broker.connect(infra.nats_url, subjects, name="test-earlier-version")
    try:
        stream = subjects.frames_in_stream
        await old.js.add_stream(
            StreamConfig(
                name=stream,
                subjects=[f"{prefix}.frames.in.*.*"],
                retention=RetentionPolicy.WORK_QUEUE,
                num_replicas=infra.stream_replicas,
            )
        )
        await old.js.publish(subjects.frames_in("default", str(uuid.uuid4())), b"{}")
        async with InProcessStack(
            infra.nats_url,
            db_url,
            prefix,
            executors=0,
            overrides={"stream_replicas": infra.stream_replicas},
        ):
            await eventually(
                lambda: any("drain it" in r.getMessage().lower() for r in caplog.records),
                timeout=15,
            )
            assert await old.stream_messages(stream) == 1
    finally:
        await old.close()


async def test_a_client_follows_a_run_from_its_join_to_its_done(
    archive: InProcessStack, broker: Broker
) -> None:
    """Replay plus live gives each frame once, in order, with the stream's new shape
    (frames published on `frames.out`, stored under the client subject)."""
    (run_id,) = await _runs(archive, 1)
    chain = AttemptFrames(broker, run_id)
    await chain.run(["a ", "b "], done=False)
    following = asyncio.create_task(collect(archive.client, run_id, timeout=30))
    await eventually(lambda: _counted(archive, run_id, chain.seq), timeout=15)
    await chain.run([f"{i} " for i in range(20)])

    frames, transcript = await following
    assert [f.seq for f in frames] == list(range(1, chain.seq + 1))
    assert transcript.text == "a b " + "".join(f"{i} " for i in range(20))


async def test_a_quiet_runs_frames_are_written_in_one_segment(
    infra: Servers, db_url: str, prefix: str
) -> None:
    """A run whose output follows its `run` frame at once (most runs) costs Postgres one
    segment statement: the `run` frame waits for `done` (or the flush timer, here too long
    to matter), and `done` is written at once."""
    async with _publishing(infra, db_url, prefix, segment_flush_ms=60_000) as (stack, publisher):
        await _hearing_live(stack, publisher)
        (run_id,) = await _runs(stack, 1)
        await AttemptFrames(publisher, run_id).run(["a ", "b "])
        await eventually(lambda: all_frames_stored(stack.store, run_id, 4), timeout=15)
        segments = await stack.store.segments_after(run_id, 0)
    assert [[f["seq"] for f in s.frames] for s in segments] == [[1, 2, 3, 4]]


async def test_a_runs_frames_wait_for_its_own_done_not_another_runs(
    infra: Servers, db_url: str, prefix: str
) -> None:
    """Another run's `done` writes that run's frames at once, not the frames a run in
    progress has buffered: each run's frames are one segment (when every `done` wrote
    every buffer, most runs were cut in two at hundreds of runs a second)."""
    async with _publishing(infra, db_url, prefix, segment_flush_ms=60_000) as (stack, publisher):
        await _hearing_live(stack, publisher)
        going, ending = await _runs(stack, 2)
        attempt = AttemptFrames(publisher, going)
        await attempt.run(["a "], done=False)
        await AttemptFrames(publisher, ending).run(["b "])
        await eventually(lambda: all_frames_stored(stack.store, ending, 3), timeout=15)
        assert await archived_seqs(stack.store, going) == []
        await attempt.run(["c "])
        await eventually(lambda: all_frames_stored(stack.store, going, 4), timeout=15)
        segments = await stack.store.segments_after(going, 0)
    assert [[f["seq"] for f in s.frames] for s in segments] == [[1, 2, 3, 4]]


async def test_a_run_in_progress_has_its_frames_written_once_they_are_old_enough(
    infra: Servers, db_url: str, prefix: str
) -> None:
    """Without a frame that must be written at once, a run's frames reach Postgres
    `segment_flush_ms` after the first of them (not only when the run ends)."""
    async with _publishing(infra, db_url, prefix, segment_flush_ms=300) as (stack, publisher):
        (run_id,) = await _runs(stack, 1)
        await AttemptFrames(publisher, run_id).run(["a ", "b "], done=False)

        async def written() -> bool:
            return await archived_seqs(stack.store, run_id) == [1, 2, 3]

        await eventually(written, timeout=15)
