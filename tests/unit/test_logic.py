"""Pure logic: the relay's reading of stored frames, the scripted runner's resume point,
backoff, SQL files."""

import gc
import random
from datetime import UTC, datetime

import pytest

from runwire.contracts.frames import Frame, FrameType
from runwire.executor.outcome import backoff_ms
from runwire.relay.segments import _contiguous
from runwire.relay.stored import MalformedFrame, parse_stored
from runwire.runners.scripted import tokens_delivered
from runwire.runtime.store import QUERIES, load_queries
from runwire.runtime.stream_reads import FramePosition, frame_position

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "headers",
    [
        {"Nats-Msg-Id": "r:3:5", "Rw-Pos": "3 5 7 done"},
        # A frame an earlier version published, with a header for each part.
        {"Rw-Generation": "3", "Rw-Raw-Seq": "5", "Rw-Seq": "7", "Rw-Type": "done"},
    ],
)
def test_a_frames_position_is_read_from_its_headers(headers: dict[str, str]) -> None:
    assert frame_position(headers) == FramePosition(3, 5, 7, "done")


def _stored_body(run_id: str, seq: int, type_: str = "message") -> bytes:
    data = {"text": "x"} if type_ == "message" else {"status": "finished"}
    return (
        Frame(run_id=run_id, seq=seq, type=FrameType(type_), data=data, at=datetime.now(UTC))
        .model_dump_json()
        .encode()
    )


RUN = "0190f3c0-0000-7000-8000-000000000001"
SUBJECT = f"rw.acme.runs.{RUN}.frames"


def test_a_stored_frame_is_read_with_its_run_and_position() -> None:
    stored = parse_stored(SUBJECT, {"Rw-Pos": "2 1 4 done"}, _stored_body(RUN, 4, "done"), 9)
    assert (stored.tenant, stored.run_id, stored.seq, stored.stream_seq) == ("acme", RUN, 4, 9)
    assert stored.is_done
    assert stored.position.generation == 2


@pytest.mark.parametrize(
    ("subject", "headers", "body"),
    [
        (SUBJECT, {}, _stored_body(RUN, 1)),  # no Rw-Pos
        (SUBJECT, {"Rw-Pos": "1 1 x message"}, _stored_body(RUN, 1)),  # damaged
        (SUBJECT, {"Rw-Pos": "1 1 1 message"}, b"not json"),
        (SUBJECT, {"Rw-Pos": "1 1 1 message"}, b'{"v": 1, "seq": 1}'),
        (SUBJECT, {"Rw-Pos": "1 2 2 message"}, _stored_body(RUN, 1)),  # header disagrees
        (SUBJECT, {"Rw-Pos": "1 1 1 done"}, _stored_body(RUN, 1)),
        (SUBJECT.replace(RUN, "other"), {"Rw-Pos": "1 1 1 message"}, _stored_body(RUN, 1)),
        ("rw.frames.out.acme.r", {"Rw-Pos": "1 1 1 message"}, _stored_body(RUN, 1)),
    ],
)
def test_a_malformed_message_is_no_stored_frame(
    subject: str, headers: dict[str, str], body: bytes
) -> None:
    with pytest.raises(MalformedFrame) as refused:
        parse_stored(subject, headers, body, 1)
    if subject == SUBJECT:
        assert refused.value.run_id == RUN  # logged with its run


def test_stored_frames_become_one_segment_per_unbroken_range() -> None:
    frames = [
        parse_stored(SUBJECT, {"Rw-Pos": f"1 {s} {s} {t}"}, _stored_body(RUN, s, t), 10 + s)
        for s, t in [(2, "message"), (3, "message"), (5, "message"), (6, "done")]
    ]
    segments = _contiguous(RUN, frames)
    assert [(g.first_seq, g.last_seq, g.last_stream_seq, g.closed) for g in segments] == [
        (2, 3, 13, False),
        (5, 6, 16, True),
    ]
    assert [len(g.frames) for g in segments] == [2, 2]


@pytest.mark.parametrize("packed", ["3 5 done", "a b c d", "3 5 7 done extra"])
def test_a_damaged_position_is_no_position(packed: str) -> None:
    assert frame_position({"Rw-Pos": packed}) is None
    assert frame_position({}) is None


@pytest.mark.parametrize(
    ("tokens", "text", "expected"),
    [
        (["a", "b", "c"], "", 0),
        (["a", "b", "c"], "ab", 2),
        (["a", "b", "c"], "abc", 3),
        (["ab", "c"], "a", 0),
        (["x", "x"], "x", 1),
    ],
)
def test_tokens_delivered(tokens: list[str], text: str, expected: int) -> None:
    assert tokens_delivered(tokens, text) == expected


def test_backoff_grows_and_is_capped() -> None:
    rng = random.Random(7)
    for attempt in range(1, 12):
        delay = backoff_ms(attempt, 100, 5000, rng)
        ceiling = min(5000, 100 * 2 ** (attempt - 1))
        assert ceiling / 2 <= delay <= ceiling


def test_named_queries_load() -> None:
    assert {"claim_run", "heartbeat_many", "finish_run", "insert_segments"} <= set(QUERIES)
    assert load_queries("-- name: a\nSELECT 1;\n-- name: b\nSELECT 2;") == {
        "a": "SELECT 1;",
        "b": "SELECT 2;",
    }


def test_a_large_reply_is_parsed_with_collections_paused_and_the_collector_left_as_found() -> None:
    from runwire.client.connection import _collections_paused

    assert gc.isenabled()
    with _collections_paused(True):
        assert not gc.isenabled()
    assert gc.isenabled()
    with _collections_paused(False):
        assert gc.isenabled()
    gc.disable()  # a caller that runs without the collector keeps it off
    try:
        with _collections_paused(True):
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(ValueError, match="does not parse"), _collections_paused(True):
        raise ValueError("a reply that does not parse")
    assert gc.isenabled()


def test_a_large_replys_frames_are_not_left_to_the_next_young_collection() -> None:
    from runwire.client.connection import _collections_paused

    thresholds = gc.get_threshold()
    gc.set_threshold(10_000_000, 1_000, 1_000)  # no collection of its own in this test
    try:
        with _collections_paused(True):
            made = [[seq] for seq in range(20_000)]
        # Handed to the oldest generation at once: no young collection scans them.
        oldest = {id(item) for item in gc.get_objects(generation=2)}
        assert id(made) in oldest
        assert id(made[-1]) in oldest
        # A program that froze objects of its own keeps them frozen (and the frames go
        # the usual way).
        gc.freeze()
        try:
            frozen = gc.get_freeze_count()
            with _collections_paused(True):
                again = [[seq] for seq in range(20_000)]
            assert gc.get_freeze_count() == frozen
            assert id(again[-1]) in {id(item) for item in gc.get_objects(generation=0)}
        finally:
            gc.unfreeze()
    finally:
        gc.set_threshold(*thresholds)
