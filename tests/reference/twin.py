"""`chat`: the runwire runner that does what the reference graph's node does
(tests/reference/chat_graph.py), so one client script can run against both servers."""

from typing import Any

import runwire


@runwire.runner()
async def chat(ctx: runwire.AttemptContext) -> dict[str, Any]:
    """Say the tokens of `reply` (one every `delay_ms`; once, checkpointed), fail with
    `fail`, or ask `ask` and say " you said <answer>"."""
    done = (ctx.checkpoint_state or {}).get("said", 0)
    tokens: list[str] = ctx.input.get("reply") or []
    delay = (ctx.input.get("delay_ms") or 0) / 1000
    for token in tokens[done:]:
        if delay:
            await ctx.sleep(delay)
        await ctx.message(token)
    if tokens[done:]:
        await ctx.checkpoint({"said": len(tokens)})
    if ctx.input.get("fail"):
        raise runwire.RunnerError(ctx.input["fail"], retryable=False)
    if ctx.input.get("ask") is not None:
        said = await ctx.interrupt(ctx.input["ask"])
        await ctx.message(f" you said {said}")
    return {}
