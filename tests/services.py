"""Running runwire's services for a test: in this process (fast) or as real processes.

Both wire the services to the test's own database and subject prefix, with short
heartbeats, leases and ticks so that recovery and retries happen within seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runwire.client import Client, ClientError, Transcript
from runwire.contracts.errors import ErrorCode
from runwire.contracts.frames import Frame, FrameType
from runwire.executor.main import serve as serve_executor
from runwire.recovery.main import serve as serve_recovery
from runwire.relay.main import serve as serve_relay
from runwire.runtime.settings import (
    ExecutorSettings,
    RecoverySettings,
    RelaySettings,
    SubmitterSettings,
)
from runwire.runtime.store import Store
from runwire.submitter.main import serve as serve_submitter
from tests.support import eventually

ROOT = Path(__file__).resolve().parent.parent

# Short clocks so that failures are detected and recovered within a test's patience.
FAST = {
    "heartbeat_ms": 100,
    "lease_ttl_ms": 1000,
    "ack_wait_ms": 2000,
    "retry_base_ms": 50,
    "retry_max_ms": 200,
    "abort_grace_ms": 200,
    "drain_ms": 5000,
    "segment_flush_ms": 20,
    "recovery_interval_ms": 100,
    "recovery_backoff_ms": 50,
    "republish_after_ms": 2000,
    "outbox_grace_ms": 1000,
    "outbox_interval_ms": 50,
    "db_pool_size": 4,
    "log_level": "INFO",
}


def _fields(cls: type[Any], values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if k in cls.model_fields}


@dataclass
class InProcessStack:
    """The four services as tasks of the test's event loop, plus a client and a store."""

    nats_url: str
    db_url: str
    prefix: str
    overrides: dict[str, Any] = field(default_factory=dict)
    # Executors started by `async with` (0: jobs stay queued until a test starts one).
    executors: int = 1
    # Runners handed to the submitter and the executors, beside the installed ones.
    runners: dict[str, Any] = field(default_factory=dict)
    client: Client = field(init=False)
    store: Store = field(init=False)
    _services: dict[str, tuple[asyncio.Task[None], asyncio.Event]] = field(
        default_factory=dict, init=False
    )

    def settings(self, cls: type[Any], **extra: Any) -> Any:
        values = {
            **FAST,
            **self.overrides,
            **extra,
            "nats_url": self.nats_url,
            "database_url": self.db_url,
            "prefix": self.prefix,
            "log_format": "json",
        }
        return cls(**_fields(cls, values))

    def _start(
        self, name: str, serve: Callable[[Any, asyncio.Event], Awaitable[None]], settings: Any
    ) -> None:
        stop = asyncio.Event()
        self._services[name] = (asyncio.create_task(serve(settings, stop), name=name), stop)

    async def start(self, *, executors: int = 1) -> InProcessStack:
        self.store = await Store.connect(self.db_url, pool_size=2)
        self._start(
            "submitter",
            functools.partial(serve_submitter, runners=self.runners),
            self.settings(SubmitterSettings),
        )
        self._start("relay", serve_relay, self.settings(RelaySettings))
        self._start("recovery", serve_recovery, self.settings(RecoverySettings))
        for i in range(executors):
            self.start_executor(f"executor-{i}")
        self.client = await Client.connect(self.nats_url, prefix=self.prefix)
        await wait_ready(self.client)
        return self

    async def __aenter__(self) -> InProcessStack:
        return await self.start(executors=self.executors)

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def start_recovery(self, name: str) -> None:
        self._start(name, serve_recovery, self.settings(RecoverySettings))

    def start_relay(self, name: str) -> None:
        self._start(name, serve_relay, self.settings(RelaySettings))

    def start_executor(
        self, name: str = "executor-0", runners: dict[str, Any] | None = None, **extra: Any
    ) -> None:
        """An executor with `runners` (the stack's by default) beside the installed ones."""
        self._start(
            name,
            functools.partial(serve_executor, runners=self.runners if runners is None else runners),
            self.settings(ExecutorSettings, executor_id=name, **extra),
        )

    async def stop_service(self, name: str, timeout: float = 15.0) -> None:
        task, stop = self._services.pop(name)
        stop.set()
        await asyncio.wait_for(task, timeout)

    async def close(self) -> None:
        await self.client.close()
        for name in list(self._services):
            task, stop = self._services[name]
            stop.set()
        for name, (task, _) in list(self._services.items()):
            try:
                await asyncio.wait_for(task, 15)
            except (Exception, asyncio.CancelledError) as exc:  # noqa: BLE001
                print(f"service {name} did not stop cleanly: {exc!r}")
        self._services.clear()
        await self.store.close()

    def check_alive(self) -> None:
        """Fail if a service task died (its exception would otherwise go unseen)."""
        for name, (task, _) in self._services.items():
            if task.done():
                raise AssertionError(f"service {name} exited: {task.exception()!r}")


async def wait_ready(client: Client, timeout: float = 30) -> None:
    """Until the submitter and the relay answer (NOT_FOUND for a run that does not exist)."""
    probe = str(uuid.uuid4())

    async def answered(call: Callable[[str], Awaitable[Any]]) -> bool:
        try:
            await call(probe)
        except ClientError as exc:
            if exc.code == ErrorCode.NOT_FOUND:
                return True
            raise AssertionError(f"not ready: {exc}") from exc
        return True

    await eventually(lambda: answered(client.get), timeout=timeout, interval=0.1)
    await eventually(lambda: answered(client.join), timeout=timeout, interval=0.1)


async def collect(
    client: Client, run_id: str, after: int = 0, timeout: float = 30
) -> tuple[list[Frame], Transcript]:
    """Every frame of a run after a cursor until `done`, and the text they make."""
    frames: list[Frame] = []
    transcript = Transcript()

    async def read() -> None:
        async for frame in client.stream(run_id, after):
            frames.append(frame)
            transcript.apply(frame)

    await asyncio.wait_for(read(), timeout)
    return frames, transcript


async def all_frames_stored(store: Store, run_id: str, frames: int) -> bool:
    """Postgres has every one of the run's `frames`, in segments, and knows it is done."""
    run = await store.get_run_by_id(run_id)
    return bool(run and run.frames_closed and run.frame_count == run.last_seq == frames)


def assert_well_formed(frames: list[Frame], after: int = 0) -> None:
    """Seqs strictly increase from the cursor with no gap, and `done` is last and once."""
    seqs = [f.seq for f in frames]
    assert seqs == list(range(after + 1, after + 1 + len(frames))), seqs
    assert frames[-1].type == FrameType.DONE
    assert [f.type for f in frames].count(FrameType.DONE) == 1


class ServiceProcess:
    """One service as a real process, for kill -9, SIGSTOP and restarts."""

    def __init__(
        self, name: str, module: str, env: dict[str, str], log_dir: Path, *, faststream: bool
    ) -> None:
        self.name = name
        self.module = module
        self.env = env
        self.log_path = log_dir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        # `faststream run services.<name>.main:app` instead of `python -m services.<name>`.
        self.faststream = faststream

    def start(self) -> ServiceProcess:
        log = self.log_path.open("ab")
        command = (
            ["-m", "faststream", "run", f"{self.module}.main:app"]
            if self.faststream
            else ["-m", self.module]
        )
        self.proc = subprocess.Popen(
            [sys.executable, *command],
            env=self.env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        return self

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill(self) -> None:
        """kill -9: no clean-up of any kind."""
        self.signal(signal.SIGKILL)
        assert self.proc is not None
        self.proc.wait(10)

    def stop(self, timeout: float = 20) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGCONT)
        self.proc.terminate()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def process_env(base: dict[str, str], **extra: Any) -> dict[str, str]:
    """A service process's environment: the test's wiring plus fast clocks."""
    env = dict(base)
    for key, value in {**FAST, **extra}.items():
        env[f"RUNWIRE_{key.upper()}"] = str(value)
    env["RUNWIRE_LOG_FORMAT"] = "json"
    return env


ATTEMPT_ENDS = {"finished", "failed", "canceled", "retry", "released", "recovering", "interrupted"}


def max_running(timeline: list[dict[str, Any]]) -> int:
    """The most attempts running at one moment, from the run_events log."""
    running: set[str] = set()
    peak = 0
    for event in timeline:
        if event["event"] == "claimed":
            running.add(event["run_id"])
        elif event["event"] in ATTEMPT_ENDS:
            running.discard(event["run_id"])
        peak = max(peak, len(running))
    return peak


MODULES = {
    "submitter": "runwire.submitter",
    "executor": "runwire.executor",
    "relay": "runwire.relay",
    "recovery": "runwire.recovery",
}


class ProcessStack:
    """Named service processes sharing one test's database and prefix."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = env
        self.log_dir = log_dir
        self.procs: dict[str, ServiceProcess] = {}
        self.client: Client
        self.store: Store

    def start(
        self, name: str, kind: str | None = None, *, faststream: bool = False, **settings: Any
    ) -> ServiceProcess:
        """Start service `kind` (default: the name without a suffix) as process `name`
        (with `faststream run` when `faststream` is set)."""
        module = MODULES[kind or name.split("-")[0]]
        extra = {"executor_id": name} if module == MODULES["executor"] else {}
        proc = ServiceProcess(
            name,
            module,
            process_env(self.env, **extra, **settings),
            self.log_dir,
            faststream=faststream,
        )
        self.procs[name] = proc.start()
        return proc

    async def open(self) -> None:
        self.client = await Client.connect(
            self.env["RUNWIRE_NATS_URL"], prefix=self.env["RUNWIRE_PREFIX"]
        )
        self.store = await Store.connect(self.env["RUNWIRE_DATABASE_URL"], pool_size=2)
        await wait_ready(self.client)

    async def close(self) -> None:
        await self.client.close()
        await self.store.close()
        for proc in self.procs.values():
            proc.stop()

    def logs(self) -> str:
        return "\n".join(f"===== {n}\n{p.logs()[-4000:]}" for n, p in self.procs.items())
