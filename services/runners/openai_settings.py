"""Where the `openai` runner sends its requests, what its calls cost, and its name in
rate limits: read from the environment (or given by field name, as tests do)."""

import math

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_BASE_URL = "https://api.openai.com/v1"


class OpenAISettings(BaseSettings):
    """Where the `openai` runner sends its requests; read from the environment (or given
    by field name, as tests do)."""

    model_config = SettingsConfigDict(
        extra="ignore", populate_by_name=True, use_attribute_docstrings=True
    )

    base_url: str = Field(
        default=DEFAULT_BASE_URL,
        validation_alias=AliasChoices("RUNWIRE_OPENAI_BASE_URL", "OPENAI_BASE_URL"),
    )
    """The OpenAI-compatible endpoint (else `OPENAI_BASE_URL`)."""
    api_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("RUNWIRE_OPENAI_API_KEY", "OPENAI_API_KEY")
    )
    """The provider's key (else `OPENAI_API_KEY`); it never reaches a log, a frame, an
    error or a span."""
    read_timeout_s: float = Field(
        default=120.0, gt=0, validation_alias=AliasChoices("RUNWIRE_OPENAI_READ_TIMEOUT_S")
    )
    """How long a stream may stay silent before the attempt gives up on it
    (retryable)."""
    connect_timeout_s: float = Field(
        default=10.0, gt=0, validation_alias=AliasChoices("RUNWIRE_OPENAI_CONNECT_TIMEOUT_S")
    )
    """How long connecting to the provider may take."""
    max_in_flight: int | None = Field(
        default=None, ge=1, validation_alias=AliasChoices("RUNWIRE_OPENAI_MAX_IN_FLIGHT")
    )
    """Attempts of the runner in flight at once over all executors (the provider's
    concurrency limit); none: the executor's `RUNWIRE_MAX_IN_FLIGHT`."""
    input_cost_per_million: float | None = Field(
        default=None, ge=0, validation_alias=AliasChoices("RUNWIRE_OPENAI_INPUT_COST_PER_MILLION")
    )
    """The price of a million prompt tokens in the tenant's cost units: with it or the
    next set, each model call also reserves and settles cost units."""
    output_cost_per_million: float | None = Field(
        default=None,
        ge=0,
        validation_alias=AliasChoices("RUNWIRE_OPENAI_OUTPUT_COST_PER_MILLION"),
    )
    """The price of a million answer tokens in the tenant's cost units."""
    rate_limit_key: str = Field(
        default="openai",
        min_length=1,
        max_length=100,
        pattern=r"^[A-Za-z0-9_.:-]+$",
        validation_alias=AliasChoices("RUNWIRE_OPENAI_RATE_LIMIT_KEY"),
    )
    """The provider key's name in rate limits (`runwire limit set`): each model call
    takes room under the limit of this name and under `<name>:<model>`, those set."""

    def cost(self, input_tokens: int, output_tokens: int) -> int:
        """What a call of this many tokens costs, in cost units (rounded up)."""
        units = (
            input_tokens * (self.input_cost_per_million or 0)
            + output_tokens * (self.output_cost_per_million or 0)
        ) / 1_000_000
        return math.ceil(units)
