"""Runners the console's tests register through `RUNWIRE_RUNNERS`: one that does what an
agent does (a tool call, model calls, a side effect), one whose words are HTML."""

from typing import Any

import runwire
from runwire.contracts.frames import FrameType

# Text that would make an element (and run a script) if a page took it as HTML.
HTML = '<img src=x onerror="window.__pwned=1">'


@runwire.runner()
async def works(ctx: runwire.AttemptContext) -> dict[str, Any]:
    """Look the weather up with a tool, answer with two model calls, and send a
    notification once (a `noop` side effect)."""
    await ctx.emit(
        FrameType.TOOL_CALL, {"id": "call_1", "name": "weather", "arguments": {"city": "Oslo"}}
    )
    await ctx.emit(
        FrameType.TOOL_RESULT,
        {"id": "call_1", "name": "weather", "output": {"sky": "snow", "celsius": -3}},
    )
    for used in ((20, 8, "small-model"), (10, 4, "large-model")):
        await ctx.emit(
            FrameType.USAGE,
            {
                "input_tokens": used[0],
                "output_tokens": used[1],
                "total_tokens": used[0] + used[1],
                "model": used[2],
            },
        )
    receipt = await ctx.effect("noop", "notify", {"to": "ops", "text": "snow in Oslo"})
    await ctx.message("Snow in Oslo, -3 °C.")
    return {"notified": receipt["id"]}


@runwire.runner()
async def tricky(ctx: runwire.AttemptContext) -> dict[str, Any]:
    """Say HTML, call a tool with it, ask it, and fail with it in the error's message."""
    if not (ctx.checkpoint_state or {}).get("said"):
        await ctx.message(HTML)
        await ctx.emit(
            FrameType.TOOL_CALL, {"id": "call_x", "name": HTML, "arguments": {"q": HTML}}
        )
        await ctx.emit(FrameType.TOOL_RESULT, {"id": "call_x", "name": HTML, "error": HTML})
        await ctx.checkpoint({"said": True})
    await ctx.interrupt(HTML)
    raise runwire.RunnerError(f"refused: {HTML}", retryable=False)
