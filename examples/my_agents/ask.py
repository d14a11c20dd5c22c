"""A runner that asks before it acts: the run waits, holding no worker, until a person
answers with `runwire resume RUN_ID --value '{"send": true}'`."""

import runwire


@runwire.runner()
async def ask(ctx: runwire.AttemptContext) -> dict[str, bool]:
    if not (ctx.checkpoint_state or {}).get("drafted"):
        await ctx.message("Draft: 'See you at noon.' ")
        await ctx.checkpoint({"drafted": True})  # the next attempt starts after this
    answer = await ctx.interrupt({"question": "Send it?"}, timeout=3600)
    await ctx.message("Sent." if answer.get("send") else "Not sent.")
    return {"sent": bool(answer.get("send"))}
