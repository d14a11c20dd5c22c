"""Property: whatever the cursor and wherever the client disconnects, across a run that
fails once and resumes, the client sees every frame once, in order, and the final text."""

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runwire.client import Transcript
from runwire.contracts.frames import Frame, FrameType
from runwire.testing.servers import Servers
from tests.services import InProcessStack

pytestmark = pytest.mark.integration

T = TypeVar("T")
TOKENS = [f"p{i} " for i in range(30)]
SCRIPT = {
    "tokens": TOKENS,
    "token_delay_ms": 15,
    "fail": [{"attempt": 1, "after_tokens": 12, "kind": "retryable"}],
}


class Background:
    """The services on an event loop of their own, so hypothesis can drive examples."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(120)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def resumed_run(
    infra: Servers, db_url: str, prefix: str
) -> Iterator[tuple[Background, InProcessStack, str]]:
    bg = Background()
    stack = bg.call(InProcessStack(infra.nats_url, db_url, prefix).start())
    run_id = bg.call(stack.client.submit(SCRIPT)).run.run_id
    try:
        yield bg, stack, run_id
    finally:
        bg.call(stack.close())
        bg.close()


async def _read(stack: InProcessStack, run_id: str, after: int, cuts: list[int]) -> list[Frame]:
    """Read from `after`, leaving after `cuts[0]` frames, re-joining from the last seq..."""
    seen: list[Frame] = []
    cursor = after
    for cut in [*cuts, None]:
        taken = 0
        async for frame in stack.client.stream(run_id, cursor):
            seen.append(frame)
            cursor = frame.seq
            taken += 1
            if frame.type == FrameType.DONE or taken == cut:
                break
        if seen and seen[-1].type == FrameType.DONE:
            break
    return seen


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(after=st.integers(0, 45), cuts=st.lists(st.integers(1, 12), max_size=5))
def test_every_frame_after_any_cursor_exactly_once(
    resumed_run: tuple[Background, InProcessStack, str], after: int, cuts: list[int]
) -> None:
    bg, stack, run_id = resumed_run
    # The first examples run while the run is still streaming (live), the rest after it.
    tail = bg.call(asyncio.wait_for(_read(stack, run_id, after, cuts), 60))
    head = bg.call(_read(stack, run_id, 0, []))  # the whole run, read in one go
    last = head[-1].seq

    if after >= last:
        assert tail == []
        return
    assert [f.seq for f in tail] == list(range(after + 1, last + 1))
    assert tail[-1].type == FrameType.DONE
    assert [f.model_dump() for f in tail] == [f.model_dump() for f in head[after:]]
    transcript = Transcript()
    for frame in head[:after] + tail:
        transcript.apply(frame)
    assert transcript.text == "".join(TOKENS)
    starts = [f.data for f in head if f.type == FrameType.RUN]
    assert [s["resumed"] for s in starts] == [False, True]
