"""runwire: durable execution for AI agent runs over NATS JetStream and Postgres.

The public names, importable from `runwire` itself:

- the client: `Client`, `ClientError`, `Transcript`;
- the runner API: `AttemptContext`, `RunnerError`, `runner` (declares a runner with its
  input model), `Runner`, `WaitTimeout` (a wait of `ctx.interrupt` or
  `ctx.wait_for_signal` without an answer in time), `RateLimited` (`ctx.take_rate`
  without room: the run waits for it).

The contract models live in `runwire.contracts`, the test kit in `runwire.testing`. Names
load on first use, so a client-only install never imports the services' dependencies.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runwire.client.sdk import Client, ClientError, Transcript
    from runwire.runners.base import (
        AttemptContext,
        RateLimited,
        Runner,
        RunnerError,
        RunnerSpec,
        ToolContext,
        ToolError,
        ToolOutcome,
        ToolSpec,
        WaitTimeout,
        runner,
        tool,
    )

_PUBLIC = {
    "Client": "runwire.client.sdk",
    "ClientError": "runwire.client.sdk",
    "Transcript": "runwire.client.sdk",
    "AttemptContext": "runwire.runners.base",
    "RateLimited": "runwire.runners.base",
    "Runner": "runwire.runners.base",
    "RunnerError": "runwire.runners.base",
    "RunnerSpec": "runwire.runners.base",
    "runner": "runwire.runners.base",
    "ToolContext": "runwire.runners.base",
    "ToolOutcome": "runwire.runners.base",
    "ToolError": "runwire.runners.base",
    "ToolSpec": "runwire.runners.base",
    "tool": "runwire.runners.base",
    "WaitTimeout": "runwire.runners.base",
}

__all__ = [
    "AttemptContext",
    "Client",
    "ClientError",
    "RateLimited",
    "Runner",
    "RunnerError",
    "RunnerSpec",
    "ToolContext",
    "ToolError",
    "ToolOutcome",
    "ToolSpec",
    "Transcript",
    "WaitTimeout",
    "runner",
    "tool",
]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'runwire' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
