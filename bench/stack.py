"""The bench's own servers and runwire stacks: every service a separate process.

One nats-server and one durable Postgres (fsync on) live in a temporary folder for the
whole bench; every scenario group gets a fresh database and subject prefix, and the
peers get databases of their own on the same Postgres server.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from bench.memory import RssSampler
from runwire.client import Client, ClientError
from runwire.client.settings import rotated
from runwire.contracts.errors import ErrorCode
from runwire.infra.embedded import EmbeddedNats
from runwire.infra.postgres import EmbeddedPostgres

ROOT = Path(__file__).resolve().parent.parent
MODULES = {
    "submitter": "runwire.submitter",
    "executor": "runwire.executor",
    "relay": "runwire.relay",
    "recovery": "runwire.recovery",
    "gateway": "runwire.gateway",
}
READY_TIMEOUT_S = 60.0
EXECUTOR_READY = "executor ready"
CONCURRENCY = 64
# Every stack: inputs and runs big enough for the streaming scripts, a queue deep enough
# for the throughput burst; everything else at the services' defaults.
BASE_SETTINGS: dict[str, Any] = {
    "max_input_bytes": 8_000_000,
    # The one-frame-per-delta stream of the long run, with its `run` and `done` frames.
    "max_frames_per_run": 2_000_000,
    "queue_capacity": 100_000,
    "max_in_flight": CONCURRENCY,
}


def progress(message: str) -> None:
    """A progress line on stderr, so that stdout carries only the table."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Servers:
    """nats-server and a durable Postgres in a temporary folder, for the whole bench."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="rw-bench-"))
        self.nats = EmbeddedNats(self.folder / "nats")
        self.postgres = EmbeddedPostgres(self.folder / "pg", durable=True)
        self.nats_url = ""
        self.admin_url = ""

    def start(self) -> None:
        self.nats_url = self.nats.start()
        self.admin_url = self.postgres.start()

    def stop(self) -> None:
        self.nats.stop()
        self.postgres.stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    def database_url(self, name: str) -> str:
        return self.postgres.url(name)

    async def create_database(self, prefix: str) -> str:
        """A fresh, empty database; returns its URL."""
        name = f"{prefix}_{secrets.token_hex(4)}"
        conn = await asyncpg.connect(self.admin_url)
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()
        return self.database_url(name)


class ServiceProcess:
    """One runwire service as a real process, its output in a log file."""

    def __init__(self, name: str, module: str, env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.module = module
        self.env = env
        self.log_path = log_dir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ServiceProcess:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", self.module],
                env=self.env,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        """kill -9: no clean-up of any kind."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout: float = 20) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@dataclass
class Stack:
    """The four runwire services as processes, on a database and prefix of their own."""

    servers: Servers
    name: str
    settings: dict[str, Any] = field(default_factory=dict)
    executors: int = 1
    relays: int = 1
    # The servers of a JetStream cluster: each service process connects first to the
    # next one in turn (as `make up CLUSTER=3` does); None: the bench's one server.
    cluster_urls: list[str] | None = None
    db_url: str = ""
    prefix: str = ""
    procs: dict[str, ServiceProcess] = field(default_factory=dict)
    client: Client = field(init=False)
    db: asyncpg.Pool = field(init=False)
    sampler: RssSampler = field(default_factory=RssSampler)

    @property
    def nats_url(self) -> str:
        """What a client of this stack connects to: every server, separated by commas."""
        return ",".join(self.cluster_urls) if self.cluster_urls else self.servers.nats_url

    def env(self, **extra: Any) -> dict[str, str]:
        env = dict(os.environ)
        values = {
            "nats_url": self.nats_url,
            "database_url": self.db_url,
            "prefix": self.prefix,
            "log_format": "json",
            **self._one_tenant(),
            **self.settings,
            **extra,
        }
        for key, value in values.items():
            env[f"RUNWIRE_{key.upper()}"] = str(value)
        return env

    def _one_tenant(self) -> dict[str, Any]:
        """The bench's client is one tenant: its share is every executor slot, and its
        queue the stack's (as the docs advise: a tenant alone fills the executors)."""
        slots = int(self.settings.get("max_in_flight", CONCURRENCY)) * self.executors
        shares = {"tenant_share_runs": slots}
        if "queue_capacity" in self.settings:
            shares["tenant_queue_capacity"] = int(self.settings["queue_capacity"])
        return shares

    def start_service(self, name: str, **extra: Any) -> ServiceProcess:
        kind = name.split("-")[0]
        if kind == "executor":
            extra = {"executor_id": f"bench-{name}", **extra}
        log_dir = self.servers.folder / "logs" / self.name
        log_dir.mkdir(parents=True, exist_ok=True)
        if self.cluster_urls:
            extra = {"nats_url": rotated(self.cluster_urls, len(self.procs)), **extra}
        proc = ServiceProcess(name, MODULES[kind], self.env(**extra), log_dir).start()
        self.procs[name] = proc
        self.sampler.watch(name, proc.pid)
        return proc

    async def start(self) -> Stack:
        self.db_url = await self.servers.create_database(f"rw_{self.name}")
        self.prefix = f"b{secrets.token_hex(4)}"
        self.start_service("submitter")
        for i in range(1, self.relays + 1):
            self.start_service("relay" if self.relays == 1 else f"relay-{i}")
        self.start_service("recovery")
        for i in range(1, self.executors + 1):
            self.start_service(f"executor-{i}")
        self.client = await Client.connect(self.nats_url, prefix=self.prefix)
        await self._wait_ready()
        self.db = await asyncpg.create_pool(self.db_url, min_size=1, max_size=4)
        self.sampler.start()
        return self

    async def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        probe = str(uuid.uuid4())
        for call in (self.client.get, self.client.join):
            while True:
                self.check_alive()
                try:
                    await call(probe)
                except ClientError as exc:
                    if exc.code == ErrorCode.NOT_FOUND:
                        break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"stack {self.name} not ready:\n{self.logs()}")
                await asyncio.sleep(0.1)
        for name in self.procs:
            if name.startswith("executor"):
                await self.wait_executor(name, deadline)

    async def restart_service(self, name: str, **extra: Any) -> None:
        """Stop service process `name` and start it again with `extra` settings (none:
        the stack's own), waiting until an executor takes jobs again."""
        readies = self.procs[name].logs().count(EXECUTOR_READY)
        self.procs[name].stop()
        self.start_service(name, **extra)
        if name.startswith("executor"):
            await self.wait_executor(name, seen=readies)

    async def wait_executor(self, name: str, deadline: float | None = None, seen: int = 0) -> None:
        """Until the executor's log says it is fetching jobs (once more than `seen` times:
        its log file goes on across restarts)."""
        deadline = deadline or time.monotonic() + READY_TIMEOUT_S
        while self.procs[name].logs().count(EXECUTOR_READY) <= seen:
            self.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} not ready:\n{self.logs()}")
            await asyncio.sleep(0.1)

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.proc is not None and proc.proc.poll() not in (None, -signal.SIGKILL):
                raise RuntimeError(f"service {name} exited:\n{proc.logs()[-3000:]}")

    async def close(self) -> None:
        self.sampler.stop()
        with contextlib.suppress(Exception):
            await self.client.close()
        with contextlib.suppress(Exception):
            await self.db.close()
        for proc in self.procs.values():
            proc.stop()

    def logs(self) -> str:
        return "\n".join(f"===== {n}\n{p.logs()[-3000:]}" for n, p in self.procs.items())

    async def wait_terminal(self, run_ids: list[str], timeout: float) -> float:
        """Until every run is terminal in Postgres; returns the epoch of the last end."""
        keys = [uuid.UUID(r) for r in run_ids]
        deadline = time.monotonic() + timeout
        while True:
            row = await self.db.fetchrow(
                "SELECT count(*) AS n, extract(epoch FROM max(ended_at)) AS last FROM runs"
                " WHERE run_id = ANY($1) AND status IN"
                " ('finished', 'failed', 'canceled', 'interrupted')",
                keys,
            )
            assert row is not None
            if row["n"] >= len(keys):
                return float(row["last"])
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(keys) - row['n']} of {len(keys)} runs not terminal")
            self.check_alive()
            await asyncio.sleep(0.05)

    async def wait_relayed(self, run_ids: list[str], timeout: float) -> None:
        """Until the relay has closed every run's frames (its `done` is in Postgres)."""
        keys = [uuid.UUID(r) for r in run_ids]
        deadline = time.monotonic() + timeout
        while True:
            closed = await self.db.fetchval(
                "SELECT count(*) FROM runs WHERE run_id = ANY($1) AND frames_closed", keys
            )
            if closed >= len(keys):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(keys) - closed} of {len(keys)} runs not relayed")
            self.check_alive()
            await asyncio.sleep(0.05)


@contextlib.contextmanager
def servers() -> Iterator[Servers]:
    """The bench's nats-server and Postgres, stopped afterwards whatever happens."""
    found = Servers()
    try:
        found.start()
        yield found
    finally:
        found.stop()
