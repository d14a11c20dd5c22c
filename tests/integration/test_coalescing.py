"""Text deltas that a runner emits faster than frames are stored join into fewer
`message` frames: a client sees the same text, every frame once, in order; with
`coalesce_text` off, each delta is a frame of its own."""

from typing import Any

import pytest

import runwire
from runwire.contracts.frames import FrameType
from runwire.testing.servers import Servers
from runwire.testing.waiting import eventually
from tests.services import InProcessStack, all_frames_stored, assert_well_formed, collect

pytestmark = pytest.mark.integration

DELTAS = [f"{i} " for i in range(3000)]


@runwire.runner()
async def around_a_tool(ctx: runwire.AttemptContext) -> dict[str, Any]:
    """Two deltas, a tool call, three deltas: emitted without a pause."""
    await ctx.message("a")
    await ctx.message("b")
    await ctx.emit(FrameType.TOOL_CALL, {"id": "1", "name": "look", "arguments": {}})
    for text in ("c", "d", "e"):
        await ctx.message(text)
    return {}


def texts(frames: list[Any]) -> list[str]:
    return [f.data["text"] for f in frames if f.type == FrameType.MESSAGE]


async def test_a_fast_runners_deltas_arrive_in_fewer_frames_with_the_same_text(
    stack: InProcessStack,
) -> None:
    reply = await stack.client.submit({"tokens": DELTAS})
    run_id = reply.run.run_id
    frames, transcript = await collect(stack.client, run_id)
    await eventually(lambda: all_frames_stored(stack.store, run_id, len(frames)), timeout=20)
    replayed = await stack.client.join(run_id, 0)

    assert transcript.text == "".join(DELTAS)
    assert_well_formed(frames)
    assert len(texts(frames)) < len(DELTAS) / 10
    # The first delta goes at once (a first token is never held); the rest joined it.
    assert texts(frames)[0] == DELTAS[0]
    assert [f.model_dump() for f in replayed.replay] == [f.model_dump() for f in frames]


async def test_deltas_join_only_their_neighbours_never_across_another_frame(
    infra: Servers, db_url: str, prefix: str
) -> None:
    async with InProcessStack(
        infra.nats_url, db_url, prefix, runners={"around_a_tool": around_a_tool}
    ) as stack:
        reply = await stack.client.submit({}, runner="around_a_tool")
        frames, transcript = await collect(stack.client, reply.run.run_id)

    assert [f.type for f in frames] == [
        FrameType.RUN,
        FrameType.MESSAGE,
        FrameType.MESSAGE,
        FrameType.TOOL_CALL,
        FrameType.MESSAGE,
        FrameType.MESSAGE,
        FrameType.DONE,
    ]
    # "a" at once; "b" waited for it; the tool call first sent what waited; "c" at once
    # after the tool call; "d" and "e" waited for "c" together.
    assert texts(frames) == ["a", "b", "c", "de"]
    assert transcript.text == "abcde"


@pytest.mark.stack(coalesce_text=False)
async def test_with_coalescing_off_each_delta_is_a_frame(stack: InProcessStack) -> None:
    reply = await stack.client.submit({"tokens": DELTAS[:500]})
    frames, transcript = await collect(stack.client, reply.run.run_id)

    assert texts(frames) == DELTAS[:500]
    assert transcript.text == "".join(DELTAS[:500])
    assert_well_formed(frames)


@pytest.mark.stack(coalesce_ms=200)
async def test_with_a_hold_time_slow_deltas_join_too_and_the_first_goes_at_once(
    stack: InProcessStack,
) -> None:
    # A delta every 20 ms: each one's frame is stored long before the next, so without a
    # hold time every delta is a frame of its own.
    paced = [f"{i} " for i in range(20)]
    reply = await stack.client.submit({"tokens": paced, "token_delay_ms": 20})
    frames, transcript = await collect(stack.client, reply.run.run_id)

    assert transcript.text == "".join(paced)
    assert_well_formed(frames)
    assert texts(frames)[0] == paced[0]
    # About 400 ms of deltas held 200 ms at a time: the first, then two or three frames.
    assert len(texts(frames)) <= 6, texts(frames)
