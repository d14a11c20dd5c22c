"""The bench's runner that waits (scenario 11), registered through `RUNWIRE_RUNNERS`
as `bench_asks=bench.wait_runner:asks`: it asks at once and returns the answer, so a
run is a `run` frame, a `wait` frame, then (after `resume`) a `run` frame and `done`."""

from typing import Any

import runwire


@runwire.runner()
async def asks(ctx: runwire.AttemptContext) -> dict[str, Any]:
    """Ask (no text before: nothing to checkpoint); `timeout` (seconds) from the input."""
    answer = await ctx.interrupt({"question": "go on?"}, timeout=ctx.input.get("timeout"))
    return {"answer": answer}
