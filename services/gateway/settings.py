"""The gateway's settings: where NATS is, where it listens, whose keys it accepts."""

from pathlib import Path

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from runwire.contracts.subjects import DEFAULT_PREFIX

DEFAULT_PORT = 8480
DEFAULT_HEARTBEAT_S = 10.0
DEFAULT_MAX_BODY_BYTES = 512 * 1024
DEFAULT_MAX_REQUESTS_PER_KEY = 64
DEFAULT_MAX_CONNECTIONS = 2048


class GatewaySettings(BaseSettings):
    """`RUNWIRE_*` variables (and `.runwire/env`'s, for `make up`)."""

    model_config = SettingsConfigDict(
        env_prefix="RUNWIRE_", extra="ignore", use_attribute_docstrings=True
    )

    nats_url: str = "nats://127.0.0.1:4222"
    """NATS server, or the servers of a cluster separated by commas."""
    prefix: str = DEFAULT_PREFIX
    """Subject prefix of the stack."""
    nats_user: str | None = None
    """The gateway's own NATS identity, on a broker that enforces identities."""
    nats_password: SecretStr | None = None
    """The password of that identity."""
    nats_tls_ca: Path | None = None
    """The authority of the NATS servers' certificates: TLS connections (see
    Security)."""
    stream_replicas: int = Field(default=1, ge=1, le=5)
    """Replicas of the threads bucket (the LangGraph runs API's threads): 3 on a
    JetStream cluster of three, as the services'."""
    gateway_host: str = "127.0.0.1"
    """Address the gateway listens on."""
    gateway_port: int = Field(default=DEFAULT_PORT, ge=0, le=65_535)
    """Port the gateway listens on."""
    gateway_tls_cert: Path | None = None
    """The gateway's certificate (PEM, its chain after it): the gateway speaks HTTPS only,
    with `gateway_tls_key`. Unset: plain HTTP, for behind a proxy that ends TLS."""
    gateway_tls_key: Path | None = None
    """The private key of `gateway_tls_cert` (PEM)."""
    gateway_keys_file: Path = Path(".runwire") / "api-keys.json"
    """The API keys it accepts: a JSON file of their hashes and tenants (`runwire tenant
    add` writes it); read again when it changes."""
    gateway_cors_origins: list[str] = Field(default_factory=list)
    """Origins a browser may call the API from (CORS, a JSON list); none by default."""
    gateway_heartbeat_s: float = Field(default=DEFAULT_HEARTBEAT_S, gt=0, le=300)
    """A comment line on an idle event stream this often, so proxies keep it open."""
    gateway_max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, ge=1024)
    """Largest request body (413 past it)."""
    gateway_max_requests_per_key: int = Field(default=DEFAULT_MAX_REQUESTS_PER_KEY, ge=1)
    """Requests one API key may have in flight at once, its open event streams included
    (429 `QUOTA_EXCEEDED` past it)."""
    gateway_max_connections: int = Field(default=DEFAULT_MAX_CONNECTIONS, ge=1)
    """Connections the process takes at once (503 past it)."""
    gateway_signal_secret: SecretStr | None = Field(default=None, min_length=16)
    """Signs the signal URLs (`GET /v1/runs/{id}/signal-url`) a third party may POST a
    run's signal to without an API key; unset: there are none. `make up` sets one."""
    log_level: str = "INFO"
    """`DEBUG`, `INFO`, `WARNING` or `ERROR`."""

    @model_validator(mode="after")
    def _tls_pair(self) -> "GatewaySettings":
        if (self.gateway_tls_cert is None) != (self.gateway_tls_key is None):
            raise ValueError(
                "RUNWIRE_GATEWAY_TLS_CERT and RUNWIRE_GATEWAY_TLS_KEY go together: set both "
                "for HTTPS, or neither"
            )
        for path in (self.gateway_tls_cert, self.gateway_tls_key):
            if path is not None and not path.is_file():
                raise ValueError(f"the gateway's TLS file {path} does not exist")
        return self
