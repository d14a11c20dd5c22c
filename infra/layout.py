"""Where a local stack keeps its files: `.runwire/` in the repository, or a folder of its
own (a test's stack, say). The servers' data, the logs (the previous start's aside), the
supervisord configuration and socket, the chosen ports, the recorded pids, the identities,
the certificates and the settings files written for clients and for services started by
hand.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from runwire.infra.auth import (
    API_KEYS_FILE,
    AUTH_FILE,
    ENV_FILE,
    IDENTITIES_FILE,
    NATS_PID_FILE,
    OPERATOR_ENV_FILE,
    TENANTS_DIR,
)
from runwire.infra.certificates import CertificateFiles
from runwire.infra.supervisor import Supervisor

# The kernel limits unix socket paths to 108 bytes.
_MAX_SOCKET_PATH = 100


@dataclass(frozen=True)
class Layout:
    """Where the stack keeps its files: `folder`, or `.runwire/` in the repository."""

    repo: Path
    # Another folder for everything the stack writes (a test's own stack, say).
    folder: Path | None = None

    @property
    def root(self) -> Path:
        return self.folder if self.folder is not None else self.repo / ".runwire"

    @property
    def nats_dir(self) -> Path:
        return self.root / "nats"

    @property
    def pg_dir(self) -> Path:
        return self.root / "pg"

    @property
    def nats_pid_file(self) -> Path:
        # Named in the nats-server config that EmbeddedNats writes.
        return self.root / NATS_PID_FILE

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def previous_logs(self) -> Path:
        """The logs of the stack's previous start (`up` sets them aside here)."""
        return self.logs / "previous"

    @property
    def conf(self) -> Path:
        return self.root / "supervisord.conf"

    @property
    def env_file(self) -> Path:
        """The default tenant's client settings (and where the stack is)."""
        return self.root / ENV_FILE

    @property
    def identities_file(self) -> Path:
        """Every identity's secret (infra/auth.py); mode 0600, never committed."""
        return self.root / IDENTITIES_FILE

    @property
    def auth_file(self) -> Path:
        """The nats-server `authorization` block, included by its configuration."""
        return self.root / AUTH_FILE

    @property
    def api_keys_file(self) -> Path:
        """The hashes of the tenants' API keys, which the gateway accepts."""
        return self.root / API_KEYS_FILE

    @property
    def operator_env_file(self) -> Path:
        """The operator's client settings: admin commands, `runwire top`."""
        return self.root / OPERATOR_ENV_FILE

    @property
    def tls_dir(self) -> Path:
        """The stack's certificate authority and its servers' certificate (`make up`
        makes them, runwire.infra.certificates)."""
        return self.root / "tls"

    @property
    def certificates(self) -> CertificateFiles:
        """The files in `tls_dir`: `ca.pem` (what clients trust), `ca-key.pem`,
        `server.pem` and `server-key.pem` (the nats-servers')."""
        return CertificateFiles.in_folder(self.tls_dir)

    @property
    def tenants_dir(self) -> Path:
        """The settings files of the tenants `runwire tenant add` made (`<name>.env`)."""
        return self.root / TENANTS_DIR

    def service_env_file(self, service: str) -> Path:
        """What a service started by hand next to the stack needs (an extra executor)."""
        return self.root / "services" / f"{service}.env"

    @property
    def shape_file(self) -> Path:
        """How many nats-servers the stack was started with."""
        return self.root / "shape.json"

    @property
    def ports_file(self) -> Path:
        return self.root / "ports.json"

    @property
    def pids_file(self) -> Path:
        return self.root / "pids.json"

    @property
    def supervisord_pid_file(self) -> Path:
        return self.root / "supervisord.pid"

    @property
    def socket(self) -> Path:
        local = self.root / "supervisor.sock"
        if len(str(local)) <= _MAX_SOCKET_PATH:
            return local
        digest = hashlib.sha256(str(self.root).encode()).hexdigest()[:12]
        return Path("/tmp") / f"runwire-{digest}.sock"

    @property
    def supervisor(self) -> Supervisor:
        return Supervisor(conf=self.conf, socket=self.socket)
