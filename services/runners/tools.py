"""Tools a runner may call: declared with `runwire.tool`, found like runners.

A tool is an async function taking its arguments as a pydantic model (and, if it has a
second parameter, a `ToolContext` through which it performs side effects once) and
returning something JSON can hold. It is registered under a name through the entry-point group
`runwire.tools` (`lookup_order = "my_agents.tools:lookup_order"`) or the setting
`RUNWIRE_TOOLS` (`name=module:object,...`). A runner calls one with
`ctx.call_tool(name, arguments)`: the call and its result are frames of the run
(`tool_call`, `tool_result`), so a client sees them as they happen. The `openai` runner
offers every registered tool to the model, described by its docstring and its model's
JSON Schema.
"""

import inspect
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from runwire.runners.registry import RunnerConfigError, load_named

if TYPE_CHECKING:
    from runwire.runners.base import ToolContext

ENTRY_POINT_GROUP = "runwire.tools"

ToolFunction = Callable[..., Awaitable[Any]]


class ToolError(Exception):
    """A tool's failure, reported to the runner (and the model) as the call's `error`."""


@dataclass(frozen=True)
class ToolSpec:
    """A tool with what a model needs to call it."""

    run: ToolFunction
    input_model: type[BaseModel]
    description: str
    # The function takes a ToolContext after its arguments.
    takes_context: bool = False

    def schema(self) -> dict[str, Any]:
        """The JSON Schema of the tool's arguments."""
        return self.input_model.model_json_schema()

    async def call(self, arguments: dict[str, Any], ctx: "ToolContext | None" = None) -> Any:
        """Run the tool; bad arguments and its own failures raise ToolError."""
        try:
            args = self.input_model.model_validate(arguments)
        except ValidationError as exc:
            raise ToolError(f"invalid arguments: {exc.errors(include_url=False)}") from exc
        if self.takes_context:
            if ctx is None:
                raise ToolError("this tool needs the context of a run's attempt")
            output = await self.run(args, ctx)
        else:
            output = await self.run(args)
        try:
            json.dumps(output)
        except (TypeError, ValueError) as exc:
            raise ToolError(f"the tool returned something JSON cannot hold: {exc}") from exc
        return output


def tool(
    *, input: type[BaseModel], description: str | None = None
) -> Callable[[ToolFunction], ToolSpec]:
    """Declare a tool: `@runwire.tool(input=Args)` over an async function taking `Args`,
    and optionally a `ToolContext` (`async def send(args: Args, ctx: ToolContext)`) for
    side effects and budgets. Its description (for a model) is `description` or the
    function's docstring."""
    if not (isinstance(input, type) and issubclass(input, BaseModel)):
        raise TypeError(f"input must be a pydantic model class, not {input!r}")

    def declare(fn: ToolFunction) -> ToolSpec:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"{fn!r} is not an async function")
        text = description or inspect.getdoc(fn) or ""
        params = list(inspect.signature(fn).parameters.values())
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if not 1 <= len(positional) <= 2:
            raise TypeError(
                f"{fn!r} must take its arguments, and optionally a ToolContext: "
                f"it takes {len(positional)} positional parameters"
            )
        return ToolSpec(
            run=fn, input_model=input, description=text, takes_context=len(positional) == 2
        )

    return declare


def _spec(obj: object, where: str) -> ToolSpec:
    if isinstance(obj, ToolSpec):
        return obj
    raise RunnerConfigError(
        f"{where} is {type(obj).__name__}, not a tool: declare it with runwire.tool(input=...)"
    )


def load_tools(setting: str = "", extra: Mapping[str, object] | None = None) -> dict[str, ToolSpec]:
    """Every tool this process has: entry points, then `RUNWIRE_TOOLS`, then `extra`."""
    return load_named(
        ENTRY_POINT_GROUP,
        _spec,
        what="tool",
        rule="tool",
        variable="RUNWIRE_TOOLS",
        setting=setting,
        extra=extra,
    )
