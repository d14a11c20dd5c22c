"""A run through the four services: submit, execute, stream, finish; idempotency."""

import pytest

from runwire.contracts.frames import FrameType
from runwire.contracts.status import RunStatus
from runwire.runtime.store import Run
from runwire.testing.waiting import eventually
from tests.services import InProcessStack, assert_well_formed, collect

pytestmark = pytest.mark.integration

TOKENS = ["Hello", ",", " dur", "able", " world", "!"]


def _as_token_runs(texts: list[str]) -> bool:
    """Whether `texts` are TOKENS cut into runs of whole tokens (none split or lost)."""
    rest = list(TOKENS)
    for text in texts:
        taken = ""
        while rest and len(taken) < len(text):
            taken += rest.pop(0)
        if taken != text:
            return False
    return not rest


async def test_a_run_streams_every_token_once_and_finishes(stack: InProcessStack) -> None:
    reply = await stack.client.submit({"tokens": TOKENS, "token_delay_ms": 5}, request_id="r-1")
    assert reply.duplicate is False
    assert reply.run.status == RunStatus.QUEUED
    assert reply.run.tenant == "default"

    frames, transcript = await collect(stack.client, reply.run.run_id)

    assert_well_formed(frames)
    assert transcript.text == "".join(TOKENS)
    # A frame per token, or tokens emitted before the frame before them was stored,
    # joined: every frame's text is a run of the tokens, in order.
    assert _as_token_runs([f.data["text"] for f in frames if f.type == FrameType.MESSAGE])
    assert frames[0].type == FrameType.RUN
    assert frames[0].data == {"attempt": 1, "resumed": False, "partial_length": 0}
    assert frames[-1].data == {"status": "finished"}

    run = await stack.client.get(reply.run.run_id)
    assert run.status == RunStatus.FINISHED
    assert run.attempts == 1
    assert run.result == {"text": "".join(TOKENS)}
    assert run.started_at is not None
    assert run.ended_at is not None
    # The relay's segments reach Postgres: the run's row counts every frame.
    stored = await eventually(lambda: _closed(stack, reply.run.run_id), timeout=10)
    assert stored.last_seq == len(frames)
    assert stored.frame_count == len(frames)


async def _closed(stack: InProcessStack, run_id: str) -> Run:
    row = await stack.store.get_run_by_id(run_id)
    assert row is not None
    assert row.frames_closed
    return row


async def test_same_request_id_twice_is_one_run(stack: InProcessStack) -> None:
    first = await stack.client.submit({"tokens": ["a"]}, request_id="same")
    second = await stack.client.submit({"tokens": ["a", "b"]}, request_id="same")

    assert first.duplicate is False
    assert second.duplicate is True
    assert second.run.run_id == first.run.run_id
    await collect(stack.client, first.run.run_id)
    assert (await stack.store.run_by_request("default", "same")) is not None
    # Exactly one run exists for the request; a different tenant may reuse the key.
    other = await stack.client.submit({"tokens": ["a"]}, request_id="another")
    assert other.run.run_id != first.run.run_id


async def test_many_runs_at_once_all_finish_with_their_own_text(stack: InProcessStack) -> None:
    replies = [await stack.client.submit({"tokens": [f"run{i}", "-", "ok"]}) for i in range(20)]
    for i, reply in enumerate(replies):
        frames, transcript = await collect(stack.client, reply.run.run_id)
        assert_well_formed(frames)
        assert transcript.text == f"run{i}-ok"
