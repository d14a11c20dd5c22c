"""The `scripted` runner: deterministic output for tests, benchmarks and demos.

It emits the script's tokens as `message` frames. A resumed attempt continues after
the tokens already delivered, so the final text has each token exactly once.
"""

import asyncio
from typing import Any

from pydantic import ValidationError

from runwire.contracts.scripted import ScriptedInput
from runwire.runners.base import AttemptContext, RunnerError, runner

HANG_FOREVER_S = 3600.0


def tokens_delivered(tokens: list[str], text: str) -> int:
    """How many leading tokens `text` already holds."""
    count = pos = 0
    while count < len(tokens) and text.startswith(tokens[count], pos):
        if not tokens[count] and pos == len(text):
            break
        pos += len(tokens[count])
        count += 1
    return count


@runner(input=ScriptedInput)
async def scripted(ctx: AttemptContext) -> dict[str, Any] | None:
    """Emit the script; fail, hang or pause where the script says."""
    try:
        script = ScriptedInput.model_validate(ctx.input)
    except ValidationError as exc:
        raise RunnerError(f"invalid scripted input: {exc}", retryable=False) from exc
    failure = next((f for f in script.fail if f.attempt == ctx.attempt), None)
    start = tokens_delivered(script.tokens, ctx.continuation)
    loop = asyncio.get_running_loop()
    due = loop.time()
    for emitted, token in enumerate(script.tokens[start:]):
        if failure is not None and emitted == failure.after_tokens:
            if failure.kind == "hang":
                # Ignores the abort signal on purpose: only abandonment ends it.
                await asyncio.sleep(HANG_FOREVER_S)
            raise RunnerError(
                f"scripted {failure.kind} failure after {emitted} tokens",
                retryable=failure.kind == "retryable",
            )
        if ctx.abort.is_set():
            return None
        await ctx.message(token)
        if script.checkpoint_every and (emitted + 1) % script.checkpoint_every == 0:
            await ctx.checkpoint({"tokens_delivered": start + emitted + 1})
        if script.token_delay_ms:
            # A steady pace: one token every token_delay_ms, however long emitting took.
            due += script.token_delay_ms / 1000
            await ctx.sleep(max(0.0, due - loop.time()))
    return None
