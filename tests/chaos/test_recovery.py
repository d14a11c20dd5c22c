"""No run left behind, whatever crashes: relay, submitter, NATS, the jobs stream, Postgres."""

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from runwire.client import Client, ClientError
from runwire.contracts.status import RunStatus
from runwire.infra.embedded import EmbeddedNats
from runwire.infra.postgres import EmbeddedPostgres
from runwire.testing.waiting import eventually, fault_window, pace
from tests.services import ProcessStack, assert_well_formed, collect

pytestmark = pytest.mark.chaos

TOKENS = [f"k{i} " for i in range(30)]


def _script(i: int, delay_ms: int = 40) -> dict[str, object]:
    return {"tokens": [f"{i}:{t}" for t in TOKENS], "token_delay_ms": delay_ms}


def _text(i: int) -> str:
    return "".join(f"{i}:{t}" for t in TOKENS)


async def _assert_all_finished(stack: ProcessStack, ids: list[str], timeout: float = 90) -> None:
    """Every run finished with its exact text, in the stream and in Postgres."""
    results = await asyncio.gather(*(collect(stack.client, r, timeout=timeout) for r in ids))
    for i, (frames, transcript) in enumerate(results):
        assert_well_formed(frames)
        assert transcript.text == _text(i)
        run = await stack.client.get(ids[i])
        assert run.status == RunStatus.FINISHED
        assert run.result == {"text": _text(i)}
        stored = await eventually(lambda r=ids[i]: _closed(stack, r), timeout=20)
        assert stored.last_seq == len(frames)


async def _closed(stack: ProcessStack, run_id: str):  # type: ignore[no-untyped-def]
    row = await stack.store.get_run_by_id(run_id)
    assert row is not None
    assert row.frames_closed
    assert row.frame_count == row.last_seq
    return row


async def test_relay_killed_while_clients_stream(processes: ProcessStack) -> None:
    processes.start("executor")
    ids = [(await processes.client.submit(_script(i))).run.run_id for i in range(3)]
    streams = [asyncio.create_task(collect(processes.client, r, timeout=90)) for r in ids]
    await eventually(lambda: _some_frames(processes, ids[0], 5), timeout=20)

    processes.procs["relay"].kill()
    await fault_window(0.5, "the runs keep publishing frames while no relay runs")
    processes.start("relay")

    results = await asyncio.gather(*streams)
    for i, (frames, transcript) in enumerate(results):
        assert_well_formed(frames)
        assert transcript.text == _text(i)
    # Postgres alone can replay every frame once the stream has dropped the runs.
    await _assert_all_finished(processes, ids)
    js = processes.client.nc.jetstream()
    for i, run_id in enumerate(ids):
        await js.purge_stream(
            processes.client.subjects.run_frames_stream,
            subject=processes.client.subjects.run_frames("default", run_id),
        )
        frames, transcript = await collect(processes.client, run_id)
        assert [f.model_dump() for f in frames] == [f.model_dump() for f in results[i][0]]


async def _some_frames(stack: ProcessStack, run_id: str, n: int) -> bool:
    return len((await stack.client.join(run_id, 0)).replay) >= n


async def test_submitter_killed_mid_submit_then_retried_is_one_run(
    processes: ProcessStack,
) -> None:
    processes.start("executor")
    keys = [f"req-{i}" for i in range(20)]

    async def submit(i: int) -> str | None:
        try:
            return (await processes.client.submit(_script(i, 0), request_id=keys[i])).run.run_id
        except ClientError:
            return None

    pending = [asyncio.create_task(submit(i)) for i in range(20)]
    # Killed as soon as the first submits are stored: few of them have been answered.
    await eventually(
        lambda: processes.store._pool.fetchval("SELECT count(*) FROM runs"), interval=0.005
    )
    processes.procs["submitter"].kill()
    await asyncio.gather(*pending)
    processes.start("submitter")

    ids = []
    for i in range(20):  # the client retries every request with the same request_id
        while True:
            try:
                ids.append(
                    (await processes.client.submit(_script(i, 0), request_id=keys[i])).run.run_id
                )
                break
            except ClientError as exc:
                if not exc.retryable:
                    raise
                await pace(0.2, "between two tries of a submit refused during the outage")
    assert len(set(ids)) == 20
    for i, key in enumerate(keys):
        row = await processes.store.run_by_request("default", key)
        assert row is not None
        assert row.run_id == ids[i]
    await _assert_all_finished(processes, ids)


async def test_jobs_stream_deleted_while_runs_are_queued(processes: ProcessStack) -> None:
    ids = [(await processes.client.submit(_script(i, 0))).run.run_id for i in range(5)]
    js = processes.client.nc.jetstream()
    await js.delete_stream(processes.client.subjects.jobs_stream)

    processes.start("executor")

    await _assert_all_finished(processes, ids, timeout=60)


# -- faults of the servers themselves: each test gets servers of its own ---------------


@pytest.fixture
async def own_servers(tmp_path: Path) -> AsyncIterator[tuple[EmbeddedNats, EmbeddedPostgres]]:
    (tmp_path / "nats").mkdir()
    nats_server = EmbeddedNats(tmp_path / "nats")
    postgres = EmbeddedPostgres(tmp_path / "pg", durable=False)
    nats_server.start()
    admin = postgres.start()
    conn = await asyncpg.connect(admin)
    await conn.execute("CREATE DATABASE runwire")
    await conn.close()
    try:
        yield nats_server, postgres
    finally:
        nats_server.stop()
        postgres.stop()


async def test_a_client_closed_while_its_server_is_away_closes_without_an_error(
    tmp_path: Path,
) -> None:
    """A program closing its client while the server is gone (the client reconnecting,
    something still to send) is not handed the lost connection's error."""
    (tmp_path / "nats").mkdir()
    server = EmbeddedNats(tmp_path / "nats")
    client = await Client.connect(server.start(), tenant="acme", prefix="rw")
    server.stop()
    await eventually(lambda: client.nc.is_reconnecting)
    await client.nc.publish("rw.acme.anything", b"")  # pending when it closes
    await client.close()
    assert client.nc.is_closed


@contextlib.asynccontextmanager
async def _stack_on(
    servers: tuple[EmbeddedNats, EmbeddedPostgres], folder: Path, **executor: Any
) -> AsyncIterator[ProcessStack]:
    """The four services on these servers (the executor with `executor` settings)."""
    nats_server, postgres = servers
    env = {
        **os.environ,
        "RUNWIRE_NATS_URL": nats_server.url,
        "RUNWIRE_DATABASE_URL": postgres.url("runwire"),
        "RUNWIRE_PREFIX": "rw",
        # Republish quickly a job whose publish failed while the server was away.
        "RUNWIRE_REPUBLISH_AFTER_MS": "1000",
    }
    stack = ProcessStack(env, folder)
    for name in ("submitter", "relay", "recovery"):
        stack.start(name, republish_after_ms=1000)
    stack.start("executor", republish_after_ms=1000, **executor)
    await stack.open()
    try:
        yield stack
    finally:
        await stack.close()


@pytest.fixture
async def own_stack(
    own_servers: tuple[EmbeddedNats, EmbeddedPostgres], tmp_path: Path
) -> AsyncIterator[ProcessStack]:
    async with _stack_on(own_servers, tmp_path) as stack:
        yield stack


async def test_nats_server_restarted_while_runs_are_in_flight(
    own_servers: tuple[EmbeddedNats, EmbeddedPostgres], own_stack: ProcessStack
) -> None:
    nats_server, _ = own_servers
    ids = [(await own_stack.client.submit(_script(i, 60))).run.run_id for i in range(4)]
    await eventually(lambda: _some_frames(own_stack, ids[0], 4), timeout=20)

    await asyncio.to_thread(nats_server.stop)
    await fault_window(1.0, "the outage: nats-server is away this long")
    await asyncio.to_thread(nats_server.start)  # same port, same file storage

    await _assert_all_finished(own_stack, ids, timeout=120)


async def _runs_through_a_postgres_restart(
    stack: ProcessStack, postgres: EmbeddedPostgres, count: int
) -> list[str]:
    """`count` runs submitted; Postgres stopped for a second once they stream, then
    started again. Returns their ids."""
    ids = [(await stack.client.submit(_script(i, 60))).run.run_id for i in range(count)]
    await eventually(lambda: _some_frames(stack, ids[0], 4), timeout=20)
    await asyncio.to_thread(postgres.stop)
    await fault_window(1.0, "the outage: Postgres is away this long")
    await asyncio.to_thread(postgres.start)
    return ids


async def test_postgres_restarted_while_runs_are_in_flight(
    own_servers: tuple[EmbeddedNats, EmbeddedPostgres], own_stack: ProcessStack
) -> None:
    ids = await _runs_through_a_postgres_restart(own_stack, own_servers[1], 4)

    await _assert_all_finished(own_stack, ids, timeout=120)
    logs = "\n".join(p.logs() for p in own_stack.procs.values())
    assert "Postgres unavailable" in logs or "heartbeat not recorded" in logs


async def test_a_postgres_restart_takes_no_run_from_a_live_executor(
    own_servers: tuple[EmbeddedNats, EmbeddedPostgres], tmp_path: Path
) -> None:
    """A restart ends every session, the executor's presence lock among them, and the
    executor takes it again: leases long enough to outlast the restart keep every run on
    its first attempt (no run is taken over as if its executor had died)."""
    async with _stack_on(own_servers, tmp_path, lease_ttl_ms=30_000) as stack:
        ids = await _runs_through_a_postgres_restart(stack, own_servers[1], 3)

        await _assert_all_finished(stack, ids, timeout=120)
        for run_id in ids:
            events = await stack.store.run_events(run_id)
            assert [e["reason"] for e in events if e["event"] == "recovering"] == []
            assert (await stack.client.get(run_id)).attempts == 1
