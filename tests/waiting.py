"""Runners that wait (`ctx.interrupt`, `ctx.wait_for_signal`), as tests register them
through `RUNWIRE_RUNNERS`."""

import json
from typing import Any

import runwire


@runwire.runner()
async def asks(ctx: runwire.AttemptContext) -> dict[str, Any]:
    """Greet (once: checkpointed), ask, and say the answer. `timeout` (seconds): how long
    it waits; `handle_timeout`: no answer in time is an answer too. What it says after
    the wait is said once: an attempt that takes over from one that had said it (an
    executor that stopped renewing its lease) finds it in `ctx.continuation`."""
    if not (ctx.checkpoint_state or {}).get("greeted"):
        await ctx.message("hello ")
        await ctx.checkpoint({"greeted": True})
    try:
        answer = await ctx.interrupt({"question": "may I?"}, timeout=ctx.input.get("timeout"))
    except runwire.WaitTimeout:
        if not ctx.input.get("handle_timeout"):
            raise
        await _say_once(ctx, "no answer")
        return {"answer": None}
    await _say_once(ctx, f"you said {answer['say']}")
    return {"answer": answer, "attempt": ctx.attempt}


async def _say_once(ctx: runwire.AttemptContext, text: str) -> None:
    if not ctx.continuation.endswith(text):
        await ctx.message(text)


@runwire.runner()
async def hears(ctx: runwire.AttemptContext) -> dict[str, Any]:
    """Greet (once: checkpointed), ask `{"question": "may I?"}`, and say what the answer
    was, as JSON: whatever it is (the console's approve, reject or typed answer)."""
    if not (ctx.checkpoint_state or {}).get("greeted"):
        await ctx.message("hello ")
        await ctx.checkpoint({"greeted": True})
    answer = await ctx.interrupt({"question": "may I?"})
    await ctx.message(f"got {json.dumps(answer, sort_keys=True)}")
    return {"answer": answer}


@runwire.runner()
async def collects(ctx: runwire.AttemptContext) -> dict[str, Any]:
    """Wait until told to go on, then take two `paid` signals, in the order sent."""
    await ctx.interrupt("ready?", key="ready")
    first = await ctx.wait_for_signal("paid", key="first")
    second = await ctx.wait_for_signal("paid", key="second")
    await ctx.message(f"paid {first['amount']} then {second['amount']}")
    return {"paid": [first["amount"], second["amount"]]}


@runwire.runner()
async def naps(ctx: runwire.AttemptContext) -> dict[str, Any]:
    """Say so, sleep `seconds` (durable past the executor's `durable_sleep_s`), say so."""
    if not (ctx.checkpoint_state or {}).get("slept"):
        await ctx.message("good night ")
        await ctx.checkpoint({"slept": True})
    await ctx.sleep(float(ctx.input["seconds"]))
    await ctx.message("good morning")
    return {"attempt": ctx.attempt}


@runwire.runner()
async def expects(ctx: runwire.AttemptContext) -> dict[str, Any]:
    """Wait `timeout` seconds for a `paid` signal; no payment in time is said so."""
    try:
        paid = await ctx.wait_for_signal("paid", timeout=ctx.input.get("timeout"))
    except runwire.WaitTimeout:
        await ctx.message("not paid")
        return {"paid": None}
    await ctx.message(f"paid {paid['amount']}")
    return {"paid": paid}


@runwire.runner()
async def asks_at_once(ctx: runwire.AttemptContext) -> dict[str, Any]:
    """Ask at once, with nothing before to checkpoint, and return the answer: the
    cheapest attempt that ends to wait (`timeout` from the input)."""
    answer = await ctx.interrupt({"question": "go on?"}, timeout=ctx.input.get("timeout"))
    return {"answer": answer, "attempt": ctx.attempt}
