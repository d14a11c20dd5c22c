"""Where the client finds the stack: flags, `RUNWIRE_*` variables, or `.runwire/env`."""

from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict

from runwire.contracts.subjects import DEFAULT_PREFIX, DEFAULT_TENANT

ENV_FILE = Path(".runwire") / "env"


def find_env_file(start: Path | None = None) -> Path | None:
    """The nearest `.runwire/env` in this folder or a parent (what `make up` writes)."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / ENV_FILE
        if candidate.is_file():
            return candidate
    return None


class ClientSettings(BaseSettings):
    """Client connection settings; environment variables win over `.runwire/env`."""

    model_config = SettingsConfigDict(env_prefix="RUNWIRE_", extra="ignore")

    nats_url: str = "nats://127.0.0.1:4222"
    prefix: str = DEFAULT_PREFIX
    tenant: str = DEFAULT_TENANT


def load_settings() -> ClientSettings:
    env_file = find_env_file()
    if env_file is None:
        return ClientSettings()
    return ClientSettings(_env_file=env_file)
