"""The runner of a workflow node that names a `signal` instead of a runner: the node
waits (holding no executor) for the signal of that name sent to its workflow run, or to
its own run, and the signal's payload is its output (`{"$ref": "nodes.<id>.a"}` is its
`a`; a payload that is not an object is `{"value": payload}`). A signal sent to the
workflow run before the node waits is kept for it. The node's `deadline_ms` bounds the
wait."""

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from runwire.contracts.subjects import SIGNAL_NAME_PATTERN
from runwire.runners.base import AttemptContext, runner

# The wait's key within the node run (a node run waits once).
SIGNAL_KEY = "node"


class SignalNodeInput(BaseModel):
    """What the workflow writes for a signal node: the signal's name."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=SIGNAL_NAME_PATTERN)


@runner(input=SignalNodeInput)
async def signal_node(ctx: AttemptContext) -> dict[str, Any]:
    spec = SignalNodeInput.model_validate(ctx.input)
    payload = await ctx.wait_for_signal(spec.name, key=SIGNAL_KEY)
    return payload if isinstance(payload, dict) else {"value": payload}
