"""Running runwire's services for a test as real processes (kill -9, SIGSTOP, restarts);
the in-process stack is the test kit's (`runwire.testing.stack`).

Both wire the services to the test's own database and subject prefix, with short
heartbeats, leases and ticks so that recovery and retries happen within seconds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from runwire.client import Client
from runwire.contracts.frames import Frame, FrameType
from runwire.runtime.broker import Broker
from runwire.runtime.store import Store
from runwire.testing.servers import Servers
from runwire.testing.stack import FAST, InProcessStack, collect, wait_ready
from runwire.testing.waiting import eventually

__all__ = ["FAST", "InProcessStack", "collect", "eventually", "wait_ready"]

ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 90.0


def stack_without_executor(
    infra: Servers, db_url: str, prefix: str, **overrides: Any
) -> InProcessStack:
    """Submitter, relay and recovery, no executor (the test publishes the frames as an
    attempt does), each service as its own Postgres role and with the infrastructure's
    stream replicas, as the shared fixture runs them."""
    return InProcessStack(
        infra.nats_url,
        db_url,
        prefix,
        executors=0,
        db_roles=infra.service_roles,
        overrides={"stream_replicas": infra.stream_replicas, **overrides},
    )


async def all_frames_stored(store: Store, run_id: str, frames: int) -> bool:
    """Postgres has every one of the run's `frames`, in segments, and knows it is done."""
    run = await store.get_run_by_id(run_id)
    return bool(run and run.frames_closed and run.frame_count == run.last_seq == frames)


async def archived_seqs(store: Store, run_id: str) -> list[int]:
    """The seqs of the run's frames in its Postgres segments, in segment order (each
    frame as often as the segments hold it)."""
    return [f["seq"] for segment in await store.segments_after(run_id, 0) for f in segment.frames]


class AttemptFrames:
    """Publishes one run's frames as an attempt does (`Broker.send_frame`): each once, on
    `frames_out`, numbered with the run's seq, fenced by the run's last stored frame
    (`Nats-Expected-Last-Subject-Sequence`), with `Rw-Pos: <generation> <raw seq> <seq>
    <type>` and `Nats-Msg-Id: <run>:<generation>:<raw seq>`."""

    def __init__(
        self,
        broker: Broker,
        run_id: str,
        *,
        tenant: str = "default",
        generation: int = 1,
        traceparent: str | None = None,
    ) -> None:
        self.broker = broker
        self.traceparent = traceparent
        self.run_id = run_id
        self.tenant = tenant
        self.generation = generation
        self.seq = 0
        self.raw_seq = 0
        self.last_stream_seq = 0

    async def emit(self, type_: FrameType, data: dict[str, Any]) -> int:
        """Publish the run's next frame; its stream sequence once stored."""
        self.seq += 1
        self.raw_seq += 1
        frame = Frame(run_id=self.run_id, seq=self.seq, type=type_, data=data, at=datetime.now(UTC))
        acked = await self.broker.send_frame(
            self.tenant,
            frame,
            frame.model_dump_json().encode(),
            self.generation,
            self.raw_seq,
            self.last_stream_seq,
            traceparent=self.traceparent,
        )
        self.last_stream_seq = await acked
        return self.last_stream_seq

    async def run(self, texts: list[str], *, done: bool = True) -> None:
        """A `run` frame, a `message` frame per text, and `done` (unless told not to)."""
        if self.seq == 0:
            await self.emit(FrameType.RUN, {"attempt": 1, "resumed": False, "partial_length": 0})
        for text in texts:
            await self.emit(FrameType.MESSAGE, {"text": text})
        if done:
            await self.emit(FrameType.DONE, {"status": "finished"})


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
        try:
            # Long: on a busy machine (two test workers, each with its own servers and
            # processes) a service process has taken over 30 s to start.
            await wait_ready(self.client, timeout=READY_TIMEOUT_S)
        except AssertionError as exc:
            exited = {
                n: p.proc.returncode
                for n, p in self.procs.items()
                if p.proc and p.proc.poll() is not None
            }
            raise AssertionError(f"{exc}; exited: {exited}\n{self.logs()}") from exc

    async def allow_effects(self, *kinds: str) -> None:
        """Let the tenant's runs perform effects of `kinds` (none named: every kind), as
        an operator does; until then they may perform none."""
        await self.client.set_policy(effects=list(kinds) or None)

    async def close(self) -> None:
        await self.client.close()
        await self.store.close()
        for proc in self.procs.values():
            proc.stop()

    def logs(self) -> str:
        return "\n".join(f"===== {n}\n{p.logs()[-4000:]}" for n, p in self.procs.items())
