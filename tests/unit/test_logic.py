"""Pure logic: the relay's ordering, the scripted runner's resume point, backoff, SQL files."""

import gc
import random

import pytest

from runwire.executor.outcome import backoff_ms
from runwire.relay.pipeline import _cursor_from
from runwire.relay.sequencer import RunCursor, Verdict
from runwire.runners.scripted import tokens_delivered
from runwire.runtime.store import QUERIES, load_queries
from runwire.runtime.stream_reads import FramePosition, StoredMsg, frame_position

pytestmark = pytest.mark.unit


def test_cursor_keeps_in_order_frames_and_numbers_them_across_generations() -> None:
    cursor = RunCursor()
    assert cursor.judge(1, 1) == Verdict.KEEP
    assert cursor.advance(1, 1, False) == 1
    assert cursor.judge(1, 2) == Verdict.KEEP
    assert cursor.advance(1, 2, False) == 2
    assert cursor.judge(1, 2) == Verdict.DROP  # repeat
    assert cursor.judge(1, 4) == Verdict.WAIT  # gap
    assert cursor.judge(2, 1) == Verdict.KEEP  # a new attempt starts
    assert cursor.advance(2, 1, False) == 3
    assert cursor.judge(1, 3) == Verdict.DROP  # the fenced-out attempt came back
    assert cursor.judge(3, 2) == Verdict.WAIT
    cursor.advance(2, 2, True)
    assert cursor.judge(3, 1) == Verdict.DROP  # nothing after done


@pytest.mark.parametrize(
    "headers",
    [
        {"Nats-Msg-Id": "r:7", "Rw-Pos": "3 5 7 done"},
        # A frame an earlier version published, with a header for each part.
        {"Rw-Generation": "3", "Rw-Raw-Seq": "5", "Rw-Seq": "7", "Rw-Type": "done"},
    ],
)
def test_a_relay_takes_a_run_up_where_its_last_published_frame_stands(
    headers: dict[str, str],
) -> None:
    last = StoredMsg(42, headers, b"{}")
    assert frame_position(headers) == FramePosition(3, 5, 7, "done")
    cursor = _cursor_from(last, None)
    assert (cursor.generation, cursor.raw_seq, cursor.seq, cursor.closed) == (3, 5, 7, True)
    # Nothing after `done`, and an older attempt's frame is a repeat.
    assert cursor.judge(3, 6) == Verdict.DROP


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
