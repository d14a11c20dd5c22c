"""Tools a runner may call, found like runners (declared with `runwire.tool`, in base).

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

from collections.abc import Mapping

from runwire.runners.base import ToolSpec
from runwire.runners.registry import RunnerConfigError, load_named

ENTRY_POINT_GROUP = "runwire.tools"


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
