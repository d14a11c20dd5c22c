"""Input of the `scripted` runner: deterministic runs for tests, benchmarks and demos."""

from typing import Literal

from pydantic import Field

from runwire.contracts.base import WireModel


class ScriptedFailure(WireModel):
    """Make one attempt fail after some tokens."""

    attempt: int = Field(ge=1)
    after_tokens: int = Field(ge=0)
    kind: Literal["retryable", "fatal", "hang"]


class ScriptedInput(WireModel):
    """The script: tokens to emit as `message` frames, with optional pauses and faults."""

    tokens: list[str] = Field(max_length=10_000_000)
    token_delay_ms: int = Field(default=0, ge=0, le=600_000)
    checkpoint_every: int = Field(default=0, ge=0)
    fail: list[ScriptedFailure] = Field(default_factory=list)
