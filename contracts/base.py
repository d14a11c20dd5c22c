"""The base of every wire body: version 1, unknown fields rejected."""

from typing import Literal

from pydantic import BaseModel, ConfigDict


class WireModel(BaseModel):
    """A JSON body on the wire. Unknown fields are an error, never ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Versioned(WireModel):
    """A top-level body: carries the contract version."""

    v: Literal[1] = 1
