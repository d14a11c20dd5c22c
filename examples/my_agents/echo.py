"""A runner of your own: it says `text`, `times` times."""

from pydantic import BaseModel

import runwire


class Echo(BaseModel):
    text: str
    times: int = 1


@runwire.runner(input=Echo, max_in_flight=16)
async def echo(ctx: runwire.AttemptContext) -> dict[str, int]:
    args = Echo.model_validate(ctx.input)
    for _ in range(args.times):
        if ctx.abort.is_set():
            break
        await ctx.message(args.text)
    return {"echoed": args.times}
