"""The runner of a workflow node that names an `effect` instead of a runner: it performs
the node's input as the request of that effect adapter, once, through the side-effect
fence (a retried or resumed attempt gets the stored receipt), and the receipt is the
node's output: `{"$ref": "nodes.<id>.id"}` is the receipt's id (the run's result is the
receipt with an empty `text`, as any runner's result has its text)."""

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from runwire.contracts.subjects import EFFECT_KIND_PATTERN
from runwire.runners.base import AttemptContext, runner

# The effect's key within the node run (a node run performs one effect).
EFFECT_KEY = "node"
# The name this runner is registered under (entry point group `runwire.runners`).
EFFECT_RUNNER = "effect"


class EffectNodeInput(BaseModel):
    """What the workflow writes for an effect node: the adapter and its request."""

    model_config = ConfigDict(extra="forbid")

    kind: str = Field(pattern=EFFECT_KIND_PATTERN)
    request: dict[str, Any]


@runner(input=EffectNodeInput)
async def effect_node(ctx: AttemptContext) -> dict[str, Any]:
    spec = EffectNodeInput.model_validate(ctx.input)
    receipt = await ctx.effect(spec.kind, EFFECT_KEY, spec.request)
    return dict(receipt)
