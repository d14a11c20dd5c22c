"""Scenario 8: the same throughput and latency workloads on DBOS and on pgqueuer.

Each peer gets a database of its own on the bench's Postgres, and a worker process of
its own (`bench.dbos_worker`, `bench.pgqueuer_worker`) with the same concurrency as
runwire's `max_in_flight`; the bench process is the client, with up to 256 requests
outstanding. A job is done when the peer has recorded it done in Postgres: DBOS's
`workflow_status.updated_at` of a SUCCESS row, pgqueuer's `pgqueuer_log.created` of a
`successful` row. A peer that cannot be installed or started is reported, with why.
"""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import asyncpg

from bench.memory import RssSampler
from bench.results import Results
from bench.stack import ROOT, Servers, progress
from bench.throughput import OUTSTANDING

DBOS_POLL_S = 0.05
READY_TIMEOUT_S = 90.0


class PeerUnavailable(Exception):
    """The peer cannot be installed or run here; the message says why."""


class Peer:
    """A peer system: a worker process, a client, and how to read completions."""

    name = ""
    module = ""
    package = ""

    def __init__(self, servers: Servers, concurrency: int) -> None:
        self.servers = servers
        self.concurrency = concurrency
        self.db_url = ""
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = servers.folder / f"{self.name}-worker.log"
        self.sampler = RssSampler()
        self.db: asyncpg.Pool | None = None

    def worker_args(self, ready: Path) -> list[str]:
        raise NotImplementedError

    async def open_client(self) -> None:
        raise NotImplementedError

    async def close_client(self) -> None:
        raise NotImplementedError

    async def submit(self) -> tuple[str, float]:
        """Enqueue one job; return its id and the wall time it was sent."""
        raise NotImplementedError

    async def done_times(self, ids: list[str]) -> dict[str, float]:
        """Epoch seconds at which each done job was recorded done."""
        raise NotImplementedError

    async def start(self) -> None:
        if importlib.util.find_spec(self.package) is None:
            raise PeerUnavailable(f"the `{self.package}` package is not installed")
        self.db_url = await self.servers.create_database(f"peer_{self.name}")
        ready = self.servers.folder / f"{self.name}.ready"
        ready.unlink(missing_ok=True)  # left by this peer's worker of an earlier scenario
        self.proc = self._spawn(ready)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log_path.read_text(errors="replace")[-1500:]
                raise PeerUnavailable(f"{self.name} worker did not start: {tail}")
            await asyncio.sleep(0.1)
        self.sampler.watch(f"{self.name} worker", self.proc.pid)
        self.sampler.start()
        self.db = await asyncpg.create_pool(self.db_url, min_size=1, max_size=2)
        await self.open_client()

    def _spawn(self, ready: Path) -> subprocess.Popen[bytes]:
        with self.log_path.open("ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", self.module, *self.worker_args(ready)],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    async def stop(self) -> None:
        self.sampler.stop()
        if self.db is not None:
            await self.close_client()
            await self.db.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    async def wait_done(self, ids: list[str], timeout: float) -> dict[str, float]:
        deadline = time.monotonic() + timeout
        while True:
            done = await self.done_times(ids)
            if len(done) >= len(ids):
                return done
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{len(ids) - len(done)} of {len(ids)} {self.name} jobs not done"
                )
            if self.proc is not None and self.proc.poll() is not None:
                raise PeerUnavailable(f"{self.name} worker exited during the run")
            await asyncio.sleep(0.05)

    async def throughput(self, n: int) -> tuple[float, float]:
        """Jobs done per second over `n` jobs, and the seconds it took."""
        gate = asyncio.Semaphore(OUTSTANDING)
        ids: list[str] = []

        async def one() -> None:
            async with gate:
                ids.append((await self.submit())[0])

        first = time.time()
        await asyncio.gather(*(one() for _ in range(n)))
        done = await self.wait_done(ids, timeout=max(180.0, n / 5))
        elapsed = max(done.values()) - first
        return n / elapsed, elapsed

    async def at_rate(self, rate: float, seconds: float) -> tuple[list[float], list[float], float]:
        """Submit → reply and submit → done (in Postgres) in ms, and the achieved rate."""
        count = max(1, int(rate * seconds))
        sent: dict[str, float] = {}
        replies: list[float] = []

        async def one() -> None:
            start = time.perf_counter()
            job_id, wall = await self.submit()
            replies.append((time.perf_counter() - start) * 1000)
            sent[job_id] = wall

        tasks = []
        begin = time.perf_counter()
        for i in range(count):
            delay = begin + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one()))
        achieved = count / max(1e-9, time.perf_counter() - begin)
        await asyncio.gather(*tasks)
        done = await self.wait_done(list(sent), timeout=120)
        return replies, [(done[j] - sent[j]) * 1000 for j in sent], achieved


class Dbos(Peer):
    name = "dbos"
    module = "bench.dbos_worker"
    package = "dbos"

    def worker_args(self, ready: Path) -> list[str]:
        return [self.db_url, str(self.concurrency), str(DBOS_POLL_S), str(ready)]

    async def open_client(self) -> None:
        from dbos import DBOSClient

        # enqueue_async runs the blocking enqueue in the loop's default thread pool.
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(32))
        self.client = DBOSClient(system_database_url=self.db_url, system_database_pool_size=32)

    async def close_client(self) -> None:
        self.client.destroy()

    async def submit(self) -> tuple[str, float]:
        from dbos import EnqueueOptions

        from bench.dbos_worker import QUEUE, WORKFLOW

        workflow_id = str(uuid.uuid4())
        options: EnqueueOptions = {
            "queue_name": QUEUE,
            "workflow_name": WORKFLOW,
            "workflow_id": workflow_id,
        }
        wall = time.time()
        await self.client.enqueue_async(options)
        return workflow_id, wall

    async def done_times(self, ids: list[str]) -> dict[str, float]:
        assert self.db is not None
        rows = await self.db.fetch(
            "SELECT workflow_uuid, updated_at FROM dbos.workflow_status"
            " WHERE status = 'SUCCESS' AND workflow_uuid = ANY($1::text[])",
            ids,
        )
        return {r["workflow_uuid"]: r["updated_at"] / 1000 for r in rows}


class Pgqueuer(Peer):
    name = "pgqueuer"
    module = "bench.pgqueuer_worker"
    package = "pgqueuer"

    def worker_args(self, ready: Path) -> list[str]:
        return [self.db_url, str(self.concurrency), str(ready)]

    async def open_client(self) -> None:
        from pgqueuer import Queries

        self.pool = await asyncpg.create_pool(self.db_url, min_size=4, max_size=16)
        self.queries = Queries.from_asyncpg_pool(self.pool)

    async def close_client(self) -> None:
        await self.pool.close()

    async def submit(self) -> tuple[str, float]:
        from bench.pgqueuer_worker import ENTRYPOINT

        wall = time.time()
        ids = await self.queries.enqueue(ENTRYPOINT, None)
        return str(ids[0]), wall

    async def done_times(self, ids: list[str]) -> dict[str, float]:
        assert self.db is not None
        rows = await self.db.fetch(
            "SELECT job_id, extract(epoch FROM created) AS at FROM pgqueuer_log"
            " WHERE status = 'successful' AND job_id = ANY($1::bigint[])",
            [int(i) for i in ids],
        )
        return {str(r["job_id"]): float(r["at"]) for r in rows}


def both(servers: Servers, concurrency: int) -> list[Peer]:
    """DBOS and pgqueuer, not started yet."""
    return [Dbos(servers, concurrency), Pgqueuer(servers, concurrency)]


def not_measured(results: Results, peer: Peer, exc: Exception) -> None:
    """A peer that failed: reported with its reason, never skipped silently."""
    reason = str(exc).replace("\n", " ")[:400]
    results.add(f"8 peer {peer.name}", "status", f"not measured: {reason}", "")
    progress(f"8 peer {peer.name}: not measured: {reason}")


async def measure_throughput(peer: Peer, results: Results, n: int, round_no: int) -> float:
    """One round of the throughput workload on a started peer: its rate (recorded as the
    round's; its time and memory in the first round)."""
    scenario = f"8 peer {peer.name}"
    peer.sampler.begin("throughput")
    rate, elapsed = await peer.throughput(n)
    peaks = peer.sampler.end()
    results.add(
        scenario, f"jobs done per second (round {round_no})", round(rate, 1), "jobs/s", f"{n} jobs"
    )
    progress(f"{scenario}: {rate:.0f} jobs/s (round {round_no})")
    if round_no == 1:
        results.add(scenario, "first submit → last job done", round(elapsed, 2), "s")
        for name, mib in peaks.items():
            results.add(scenario, f"peak RSS {name}, during throughput", round(mib, 1), "MiB")
    return rate


async def measure_latency(
    servers: Servers,
    results: Results,
    *,
    concurrency: int,
    rates: list[int],
    seconds: float,
    versions: dict[str, Any],
) -> None:
    """Both peers at fixed submit rates; a peer that fails is reported with its reason."""
    for peer in both(servers, concurrency):
        scenario = f"8 peer {peer.name}"
        progress(f"{scenario}: starting its worker (concurrency {concurrency})")
        try:
            await peer.start()
            for r in rates:
                await asyncio.sleep(0.5)
                replies, done, achieved = await peer.at_rate(r, seconds)
                sub = f"2 latency at {r} runs/s ({peer.name})"
                results.add(sub, "achieved submit rate", round(achieved, 1), "runs/s")
                results.add_percentiles(sub, "submit → reply", replies)
                p = results.add_percentiles(sub, "submit → terminal in Postgres", done)
                results.latency_samples[f"{peer.name} {r}/s terminal"] = done
                progress(f"{sub}: done p50 {p['p50']} ms")
            versions[peer.package] = _version(peer.package)
        except Exception as exc:  # noqa: BLE001 - recorded in the table: the bench goes on
            not_measured(results, peer, exc)
        finally:
            await peer.stop()


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"
