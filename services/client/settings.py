"""Where the client finds the stack: flags, `RUNWIRE_*` variables, or `.runwire/env`."""

import logging
import os
import ssl
import sys
from pathlib import Path
from typing import TypeVar

from pydantic import SecretStr, ValidationError
from pydantic_settings import BaseSettings, DotEnvSettingsSource, SettingsConfigDict

from runwire.contracts.subjects import DEFAULT_PREFIX, DEFAULT_TENANT

AnySettings = TypeVar("AnySettings", bound=BaseSettings)
# The exit code of a process whose configuration is unusable.
EXIT_CONFIG = 2
ENV_FILE = Path(".runwire") / "env"
# Names the settings file to read instead of the nearest `.runwire/env` (`runwire --env`).
ENV_FILE_VARIABLE = "RUNWIRE_ENV_FILE"
URL_VARIABLE = "RUNWIRE_NATS_URL"
# Where a local stack's NATS would be if nothing said otherwise.
DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
# What to check when a NATS URL that was given does not answer.
UP_HINT = "is the stack up? `make up`"


def from_env(cls: type[AnySettings]) -> AnySettings:
    """A process's settings from its environment. A value that is not valid stops the
    process with one line per variable (never its value: it may be a secret) and exit
    code EXIT_CONFIG, not a traceback."""
    try:
        return cls()
    except ValidationError as exc:
        prefix = str(cls.model_config.get("env_prefix", ""))
        for err in exc.errors():
            loc = "_".join(str(part) for part in err["loc"]).upper()
            name = prefix + loc if loc else "settings"  # a rule across several variables
            print(f"runwire: {name}: {err['msg']}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG) from None


def find_env_file(start: Path | None = None) -> Path | None:
    """The nearest `.runwire/env` in this folder or a parent (what `make up` writes)."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / ENV_FILE
        if candidate.is_file():
            return candidate
    return None


def server_urls(url: str) -> list[str]:
    """The NATS servers named by a `RUNWIRE_NATS_URL`: one URL, or several separated by
    commas (servers of one cluster, tried in that order)."""
    urls = [part.strip() for part in url.split(",") if part.strip()]
    if not urls:
        raise ValueError(f"no NATS server URL in {url!r}")
    return urls


def rotated(urls: list[str], first: int) -> str:
    """A `RUNWIRE_NATS_URL` naming every server of `urls`, from the `first`-th on (in
    turn): replicas given consecutive `first`s each connect first to a server of their
    own."""
    start = first % len(urls)
    return ",".join(urls[start:] + urls[:start])


class ClientSettings(BaseSettings):
    """Client connection settings (see `load_settings` for where they come from)."""

    model_config = SettingsConfigDict(
        env_prefix="RUNWIRE_", extra="ignore", use_attribute_docstrings=True
    )

    nats_url: str = DEFAULT_NATS_URL
    """NATS server, or the servers of a cluster separated by commas."""
    prefix: str = DEFAULT_PREFIX
    """Subject prefix of the stack."""
    tenant: str = DEFAULT_TENANT
    """The tenant whose runs the client submits and follows."""
    nats_user: str | None = None
    """The tenant's NATS identity, on a broker that enforces identities."""
    nats_password: SecretStr | None = None
    """The password of that identity."""
    nats_tls_ca: Path | None = None
    """The certificate authority that signed the NATS servers' certificates: the
    connection is TLS, the server's certificate checked against it."""


def tls_context(ca: Path | None) -> ssl.SSLContext | None:
    """The TLS context of a NATS connection whose servers' certificates `ca` signed
    (None: no TLS, unless the URL says `tls://`, which trusts the system's authorities).
    The server's name (or IP address) in the URL must be in its certificate."""
    if ca is None:
        return None
    if not ca.is_file():
        raise FileNotFoundError(f"no certificate authority file {ca} (RUNWIRE_NATS_TLS_CA)")
    if not any(isinstance(f, _TlsCloseNoise) for f in _ASYNCIO_LOG.filters):
        _ASYNCIO_LOG.addFilter(_TlsCloseNoise())
    return ssl.create_default_context(cafile=str(ca))


_ASYNCIO_LOG = logging.getLogger("asyncio")


class _TlsCloseNoise(logging.Filter):
    """Drops asyncio's warning "returning true from eof_received() has no effect when
    using ssl", which nats-py makes each time a connection it upgraded to TLS closes (its
    reader is never told that it reads TLS: nats-io/nats.py#574); the connection closes
    as it should. Without this, every CLI command over TLS ends with that line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "eof_received() has no effect when using ssl" not in record.getMessage()


def load_settings() -> ClientSettings:
    """The client's settings. A file named by `RUNWIRE_ENV_FILE` (`runwire --env FILE`)
    wins over the process's `RUNWIRE_*` variables, which only fill in what it leaves
    out: a shell that sourced one identity's settings acts as another with `--env`.
    Without one, the variables win over the nearest `.runwire/env`."""
    named = _named_env_file()
    if named is not None:
        return ClientSettings(**DotEnvSettingsSource(ClientSettings, env_file=named)())
    return ClientSettings(_env_file=find_env_file())


def _named_env_file() -> Path | None:
    given = os.environ.get(ENV_FILE_VARIABLE)
    if not given:
        return None
    if not Path(given).is_file():
        raise FileNotFoundError(f"no settings file {given}")
    return Path(given)


def unreachable_hint(settings: ClientSettings) -> str:
    """What to check when the NATS URL of `settings` (from `load_settings`) does not
    answer: for the default URL, every place that was looked in for another."""
    if "nats_url" in settings.model_fields_set:
        return UP_HINT
    named = _named_env_file()
    nearest = None if named is not None else find_env_file()
    if named is not None:
        looked = f"neither in {named} ({ENV_FILE_VARIABLE}) nor in the environment"
    elif nearest is not None:
        looked = f"neither in the environment nor in {nearest}"
    else:
        looked = (
            f"not in the environment, and there is no {ENV_FILE} in {Path.cwd()} or a "
            "folder above it"
        )
    return (
        f"the default URL: {URL_VARIABLE} is {looked}; set {URL_VARIABLE}, or "
        f"{ENV_FILE_VARIABLE} to a settings file, or work in the folder where `make up` ran"
    )
