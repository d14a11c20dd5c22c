"""Runners and a tool that tests run in a process of their own
(`RUNWIRE_ISOLATED_RUNNERS`): each says where it ran and what it was given."""

import asyncio
import os
from typing import Any

from pydantic import BaseModel

import runwire
from runwire.executor.isolation import WITHHELD


class ShoutArgs(BaseModel):
    text: str


@runwire.tool(input=ShoutArgs)
async def shout(args: ShoutArgs, ctx: runwire.ToolContext) -> dict[str, Any]:
    """Say the text louder, recording it once as an effect (the executor performs it)."""
    receipt = await ctx.effect("noop", "shout", {"text": args.text})
    return {"text": args.text.upper(), "pid": os.getpid(), "receipt": sorted(receipt)}


@runwire.runner()
async def probe(ctx: runwire.AttemptContext) -> dict[str, Any]:
    """Stream, call a tool, checkpoint; fail the first attempt after its checkpoint
    when asked to; say which process ran it and which credentials it could see."""
    await ctx.message(f"attempt {ctx.attempt} ")
    if ctx.checkpoint_state is None:
        called = await ctx.call_tool("shout", {"text": "hi"})
        await ctx.checkpoint({"shouted": called.output["text"], "tool_pid": called.output["pid"]})
        if ctx.input.get("fail_first"):
            raise runwire.RunnerError("once more", retryable=True)
    return {
        "pid": os.getpid(),
        "parent": os.getppid(),
        "seen": sorted(name for name in WITHHELD if name in os.environ),
        "checkpoint": ctx.checkpoint_state,
        "resumed": ctx.resumed,
    }


@runwire.runner()
async def waits(ctx: runwire.AttemptContext) -> dict[str, Any]:
    """Say its process id, then wait: for the abort, or (`deaf`) for nothing."""
    await ctx.message(str(os.getpid()))
    if ctx.input.get("deaf"):
        await asyncio.sleep(3600)
    await ctx.abort.wait()  # (a long ctx.sleep would be a durable timer: the attempt ends)
    return {}


@runwire.runner()
async def crashes(ctx: runwire.AttemptContext) -> dict[str, Any]:
    """Fail as badly as asked: its process exits, or it raises with a secret in hand."""
    await ctx.message("about to ")
    if ctx.input.get("how") == "exit":
        os._exit(3)
    raise ValueError("postgresql://runwire:hunter2@db/runwire")
