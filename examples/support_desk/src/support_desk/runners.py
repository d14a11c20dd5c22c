"""The support agent: finds the order a question is about and says where it is."""

import re

from pydantic import BaseModel, Field

import runwire

ORDER = re.compile(r"\border\s+#?(\d{1,12})\b", re.IGNORECASE)


class Question(BaseModel):
    question: str = Field(min_length=1, max_length=2000)


@runwire.runner(input=Question, max_in_flight=16)
async def answer(ctx: runwire.AttemptContext) -> dict[str, object]:
    """Answer one question; the order lookup is a `tool_call` and `tool_result` frame."""
    question = Question.model_validate(ctx.input).question
    found = ORDER.search(question)
    if found is None:
        await ctx.message("Which order do you mean? Please give its number.")
        return {"answered": False}
    lookup = await ctx.call_tool("lookup_order", {"order_id": found.group(1)})
    if lookup.error is not None:
        await ctx.message(f"Sorry, I could not find that order: {lookup.error}.")
        return {"answered": False}
    order = lookup.output
    await ctx.message(f"Order {order['order_id']} is {order['status']}")
    if order["carrier"]:
        await ctx.message(f", with {order['carrier']}")
    await ctx.message(".")
    return {"answered": True}
