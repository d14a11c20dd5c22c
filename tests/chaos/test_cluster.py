"""runwire on a JetStream cluster of three servers, with runs streaming under load while
servers and service replicas fail: leaders killed and restarted, one replica of each
service killed, one server cut off (SIGSTOP).

Two replicas of every service run as real processes, each connected first to a
different server (as `make up CLUSTER=3` starts them), every stream at three replicas.
Throughout, clients read every run from its start and, once it is done, again from a
cursor; after the faults every run has finished, with every frame exactly once after
any cursor, and no run had two attempts at once. The time from each fault to the first
new run streamed to its end is printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from runwire.client import ClientError
from runwire.contracts.status import RunStatus
from runwire.infra.embedded import EmbeddedNats, EmbeddedNatsCluster
from runwire.infra.stack import SERVICES, replicas
from runwire.testing.waiting import eventually, pace
from tests.chaos.conftest import FAILED
from tests.services import ATTEMPT_ENDS, ProcessStack, assert_well_formed, collect

pytestmark = pytest.mark.chaos

SERVERS = 3
TOKENS = 24
TOKEN_DELAY_MS = 25
IN_FLIGHT = 8
# A fault is over for users once a new run streams to its end within this long.
SERVED_WITHIN_S = 60.0
# How long one server stays frozen at most.
FROZEN_S = 20.0
# Leases as long as production's: a JetStream leader election (about 10 s after a
# kill -9) holds up publishes, and must not cost a run its attempt. A killed executor
# is still noticed at once, by its presence lock.
CLOCKS = {"lease_ttl_ms": 15_000, "heartbeat_ms": 1_000}


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[EmbeddedNatsCluster]:
    """Three nats-servers routed into one JetStream cluster, of this test's own."""
    # Servers ping their clients and each other every 2 s: a frozen one is noticed
    # within about 6 s (10 s by default, 30 s in all).
    servers = EmbeddedNatsCluster(tmp_path / "nats", SERVERS, ping_interval_s=2)
    await asyncio.to_thread(servers.start)
    try:
        yield servers
    finally:
        await asyncio.to_thread(servers.stop)


@pytest.fixture
async def clustered(
    cluster: EmbeddedNatsCluster,
    service_env: dict[str, str],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> AsyncIterator[ProcessStack]:
    """Two replicas of every service, each first connected to a different server."""
    env = {**service_env, "RUNWIRE_NATS_URL": cluster.url, "RUNWIRE_STREAM_REPLICAS": "3"}
    stack = ProcessStack(env, tmp_path)
    for replica in replicas(SERVICES, SERVERS, [node.url for node in cluster.nodes]):
        stack.start(replica.program, replica.service, nats_url=replica.nats_url, **CLOCKS)
    try:
        await stack.open()
        yield stack
    finally:
        await stack.close()
        if request.node.stash.get(FAILED, False):
            print(stack.logs())


@dataclass
class Load:
    """Runs submitted one after another, IN_FLIGHT at a time, each read from its start
    by a client and, once done, read again from a random cursor."""

    stack: ProcessStack
    submitted: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    checked: int = 0
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    def tokens(self, n: int) -> list[str]:
        return [f"r{n}t{i} " for i in range(TOKENS)]

    async def run(self) -> None:
        slots = asyncio.Semaphore(IN_FLIGHT)
        readers: set[asyncio.Task[None]] = set()
        n = 0
        while not self._stop.is_set():
            await slots.acquire()
            n += 1
            task = asyncio.create_task(self._one(n, slots))
            readers.add(task)
            task.add_done_callback(readers.discard)
        await asyncio.gather(*readers)

    async def _one(self, n: int, slots: asyncio.Semaphore) -> None:
        try:
            run_id = await self._submit(n)
            if run_id is None:
                return
            expected = "".join(self.tokens(n))
            frames, transcript = await collect(self.stack.client, run_id, timeout=180)
            assert_well_formed(frames)
            if transcript.text != expected:
                shown = [(f.seq, f.type.value, f.data) for f in frames]
                self.problems.append(f"{run_id}: text {transcript.text!r} from {shown}")
            cursor = random.randrange(len(frames))
            again, _ = await collect(self.stack.client, run_id, after=cursor, timeout=60)
            if [f.seq for f in again] != [f.seq for f in frames[cursor:]]:
                self.problems.append(f"{run_id}: after {cursor} got {[f.seq for f in again]}")
            elif [f.data for f in again] != [f.data for f in frames[cursor:]]:
                self.problems.append(f"{run_id}: frames after {cursor} differ")
            self.checked += 1
        except AssertionError as exc:
            self.problems.append(f"run {n}: {exc}")
        finally:
            slots.release()

    async def _submit(self, n: int) -> str | None:
        """Submit run `n`, trying again while no submitter can be reached (a fault)."""
        body = {"tokens": self.tokens(n), "token_delay_ms": TOKEN_DELAY_MS}
        # One request id for every try: a submit that was taken is not taken twice.
        request_id = str(uuid.uuid4())
        while True:
            try:
                reply = await self.stack.client.submit(body, request_id=request_id)
            except ClientError as exc:
                if not exc.retryable:
                    self.problems.append(f"submit {n} refused: {exc}")
                    return None
                await pace(0.2, "between two tries of a submit the cluster could not take")
                continue
            self.submitted.append(reply.run.run_id)
            return reply.run.run_id

    def stop(self) -> None:
        self._stop.set()


async def _served(
    stack: ProcessStack, label: str, started: float, within: float = SERVED_WITHIN_S
) -> float:
    """Seconds from `started` until a new run submitted now streams to its end."""
    while True:
        try:
            reply = await asyncio.wait_for(stack.client.submit({"tokens": [label]}), 5)
            frames, transcript = await collect(stack.client, reply.run.run_id, timeout=20)
        except (ClientError, TimeoutError):  # not served yet: try again
            if time.monotonic() - started > within:
                raise
            await pace(0.2, "between two probes while the cluster is not serving")
            continue
        # A probe that was served is checked as strictly as the load's runs.
        assert_well_formed(frames)
        assert transcript.text == label, [(f.seq, f.type.value, f.data) for f in frames]
        assert frames[-1].data == {"status": "finished"}
        return time.monotonic() - started


async def _replicas_answer(stack: ProcessStack, service: str) -> bool:
    replies = await stack.client.health(service)
    return len({reply.instance for reply in replies if reply.ok}) == 2


async def _stream_leader(
    stack: ProcessStack, cluster: EmbeddedNatsCluster, stream: str
) -> EmbeddedNats:
    info = await stack.client.nc.jetstream().stream_info(stream)
    assert info.config.num_replicas == SERVERS
    assert info.cluster is not None
    assert info.cluster.leader
    return cluster.node(info.cluster.leader)


async def _restart(cluster: EmbeddedNatsCluster, node: EmbeddedNats) -> None:
    node.start_process()
    await _healthy(cluster)


async def _healthy(cluster: EmbeddedNatsCluster) -> None:
    """Until every replica of every stream and consumer has caught up: the next fault
    must find a majority of each (a server just restarted may still be behind)."""
    await eventually(lambda: asyncio.to_thread(cluster.healthy), timeout=90, interval=0.25)


def _no_overlapping_attempts(timeline: list[dict[str, Any]]) -> list[str]:
    """Runs whose attempt was claimed while an earlier one had not ended."""
    running: set[str] = set()
    overlaps = []
    for event in timeline:
        if event["event"] == "claimed":
            if event["run_id"] in running:
                overlaps.append(event["run_id"])
            running.add(event["run_id"])
        elif event["event"] in ATTEMPT_ENDS:
            running.discard(event["run_id"])
    return overlaps


async def test_runs_stream_exactly_once_through_server_and_replica_faults(
    cluster: EmbeddedNatsCluster, clustered: ProcessStack
) -> None:
    stack = clustered
    prefix = stack.env["RUNWIRE_PREFIX"].upper()
    load = Load(stack)
    loading = asyncio.create_task(load.run())
    recovered: dict[str, float] = {}
    try:
        await eventually(lambda: load.checked >= 4, timeout=60, interval=0.1)

        # 1. The JetStream meta leader dies, and comes back.
        leader = cluster.meta_leader()
        assert leader is not None
        started = time.monotonic()
        leader.kill()
        recovered["meta leader killed"] = await _served(stack, "meta", started)
        await _restart(cluster, leader)

        # 2-3. The leader of the jobs stream, then of the client frames stream.
        for label, stream in (("jobs", f"{prefix}_JOBS"), ("run frames", f"{prefix}_RUN_FRAMES")):
            victim = await _stream_leader(stack, cluster, stream)
            started = time.monotonic()
            victim.kill()
            recovered[f"{label} stream leader killed"] = await _served(stack, label, started)
            await _restart(cluster, victim)

        # 4. One replica of each service, killed; the other carries on alone.
        started = time.monotonic()
        for service in SERVICES:
            stack.procs[f"{service}-1"].kill()
        recovered["one replica of each service killed"] = await _served(stack, "replicas", started)
        for service in SERVICES:
            stack.procs[f"{service}-1"].start()
        for service in SERVICES:  # both replicas of each serve again before the next fault
            await eventually(lambda s=service: _replicas_answer(stack, s), timeout=60, interval=0.2)

        # 5. One server cut off from the others and its clients: frozen, then let go.
        cut = next(node for node in cluster.nodes if node.url != cluster.nodes[0].url)
        await _healthy(cluster)
        started = time.monotonic()
        cut.pause()
        try:
            # Seen on nats-server 2.15: when the frozen server led streams, the other
            # two did not always elect new leaders while it stayed frozen (its routes
            # kept being accepted by the kernel). So the freeze lasts at most FROZEN_S;
            # what is asserted is that nothing is lost or repeated, and that the stack
            # serves again once the server is back.
            with contextlib.suppress(ClientError, TimeoutError):
                recovered["one server cut off"] = await _served(
                    stack, "partition", started, within=FROZEN_S
                )
        finally:
            cut.resume()
        await _healthy(cluster)
        recovered["served after the cut server is back"] = await _served(
            stack, "healed", time.monotonic()
        )
        before = load.checked
        await eventually(lambda: load.checked >= before + 4, timeout=90, interval=0.1)
    finally:
        load.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(loading, 240)

    print("\ntime to serve a new run after each fault (s):")
    recovered.setdefault("one server cut off", float("nan"))  # not served while frozen
    for fault, seconds in recovered.items():
        print(f"  {fault:40s} {seconds:6.2f}")
    assert not load.problems, "\n".join(load.problems)
    assert load.checked == len(load.submitted) >= 20
    for run_id in load.submitted:
        run = await stack.client.get(run_id)
        events = [(e["event"], e.get("actor")) for e in await stack.store.run_events(run_id)]
        assert run.status == RunStatus.FINISHED, (run_id, run.status, run.error, events)
    assert _no_overlapping_attempts(await stack.store.timeline()) == []
