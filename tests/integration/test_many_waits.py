"""10,000 runs waiting at once (issue 36) hold no executor slot, and cost recovery one
indexed statement a tick.

The services run as processes. With four executor slots, 10,000 runs of a runner that
asks all reach `waiting` through the real path (submit, attempt, `wait` frame); while
every one of them waits, a fresh run starts and finishes; answering them all finishes
them all. Recovery's wait-timeout statement, exactly as recovery issues it, is planned
by Postgres's auto_explain (nested statements too) while the 10,000 wait: it reads
run_waits once, through the index of due waits, and scans no table.

About two minutes on two cores, nearly all of it the executor: with four slots it
starts about 150 attempts a second, each attempt of the runner three commits one after
the other (claim, the wait begun, the attempt ending to wait; about 12 ms), so each
10,000 (to waiting, then to finished) takes about a minute."""

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from runwire.client import Client
from runwire.contracts.status import RunStatus
from runwire.runtime.settings import RecoverySettings
from runwire.runtime.store.schema import QUERIES
from runwire.testing.waiting import eventually
from tests.services import MODULES, ProcessStack, collect

pytestmark = pytest.mark.integration

WAITING_RUNS = 10_000
SLOTS = 4
OUTSTANDING = 256
# Every wait has a timeout (an hour: it never comes during the test), so that each is
# among the waits recovery's statement could find due.
ASK = {"timeout": 3600}
# How many times the statement is planned: Postgres plans a function's statement anew
# the first five times, then may keep a generic plan.
PLANNINGS = 7


@pytest.fixture
async def services(service_env: dict[str, str], tmp_path: Path) -> AsyncIterator[ProcessStack]:
    stack = ProcessStack(service_env, tmp_path)
    for name in MODULES:
        stack.start(
            name,
            runners="asks_at_once=tests.waiting:asks_at_once",
            max_in_flight=SLOTS,
            queue_capacity=2 * WAITING_RUNS,
        )
    try:
        await stack.open()
        yield stack
    finally:
        await stack.close()


async def _all(calls: list[Any]) -> list[Any]:
    """Await every call, at most OUTSTANDING at once."""
    gate = asyncio.Semaphore(OUTSTANDING)

    async def one(call: Any) -> Any:
        async with gate:
            return await call

    return list(await asyncio.gather(*(one(c) for c in calls)))


async def _submit_asks(client: Client, n: int) -> list[str]:
    replies = await _all([client.submit(ASK, runner="asks_at_once") for _ in range(n)])
    return [reply.run.run_id for reply in replies]


async def _statuses(conn: asyncpg.Connection, run_ids: list[str]) -> dict[str, int]:
    rows = await conn.fetch(
        "SELECT status::text AS status, count(*) AS n FROM runs"
        " WHERE run_id = ANY($1::uuid[]) GROUP BY status",
        run_ids,
    )
    return {row["status"]: row["n"] for row in rows}


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(node for child in plan.get("Plans", []) for node in _nodes(child))]


async def _plans(conn: asyncpg.Connection, sql: str, *args: Any) -> list[dict[str, Any]]:
    """The plans of `sql` and of every statement it runs inside (auto_explain, its
    output sent to this connection), in a transaction rolled back."""
    found: list[str] = []
    # Prepared first: the driver's own queries about its types are not planned here.
    statement = await conn.prepare(sql)

    def listen(_conn: object, message: asyncpg.PostgresLogMessage) -> None:
        found.append(message.message)

    conn.add_log_listener(listen)
    await conn.execute("LOAD 'auto_explain'")
    for setting in (
        "auto_explain.log_min_duration = 0",
        "auto_explain.log_nested_statements = on",
        "auto_explain.log_format = json",
        "auto_explain.log_level = notice",
    ):
        await conn.execute(f"SET {setting}")
    try:
        async with conn.transaction():
            await statement.fetch(*args)
            raise _RolledBack
    except _RolledBack:
        pass
    finally:
        await conn.execute("SET auto_explain.log_min_duration = -1")
        conn.remove_log_listener(listen)
    return [json.loads(message.split("plan:", 1)[1]) for message in found if "plan:" in message]


class _RolledBack(Exception):
    """Leaves the transaction so that it rolls back."""


@pytest.mark.timeout(400)
async def test_ten_thousand_waiting_runs_hold_no_slot_and_finish_once_answered(
    services: ProcessStack, db_url: str
) -> None:
    client = services.client
    conn = await asyncpg.connect(db_url)
    try:
        run_ids = await _submit_asks(client, WAITING_RUNS)

        async def all_waiting() -> bool:
            return (await _statuses(conn, run_ids)).get("waiting") == WAITING_RUNS

        await eventually(all_waiting, timeout=150, interval=0.5)
        held = await conn.fetchval(
            "SELECT count(*) FROM runs WHERE status = 'waiting' AND lease_owner IS NOT NULL"
        )
        assert held == 0

        # A fresh run gets a slot at once, not once the 10,000 are answered.
        fresh = (await client.submit({"tokens": ["still ", "free"]})).run.run_id
        _, transcript = await collect(client, fresh, timeout=30)
        assert transcript.text == "still free"
        assert (await client.get(fresh)).status == RunStatus.FINISHED
        assert (await _statuses(conn, run_ids)) == {"waiting": WAITING_RUNS}

        # Recovery's wait-timeout work a tick: its statement, as recovery issues it.
        batch = RecoverySettings.model_fields["batch_size"].default
        for _ in range(PLANNINGS):
            plans = await _plans(conn, QUERIES["time_out_waits"], batch, "recovery")
            nodes = [node for plan in plans for node in _nodes(plan["Plan"])]
            assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], plans
            # An index scan, or a bitmap heap scan over a bitmap index scan.
            assert {n["Relation Name"] for n in nodes if "Relation Name" in n} == {"run_waits"}, (
                plans
            )
            assert {n["Index Name"] for n in nodes if "Index Name" in n} == {"run_waits_due"}, plans
            # The statement itself and the one query it runs (nothing is due).
            assert len(plans) == 2, plans

        # And a tick's queue gauges read the runs waiting for an attempt, not the 10,000
        # waiting for an answer (their gauges are measured every 15 s, not each tick).
        await conn.execute("ANALYZE runs")
        (explained,) = json.loads(
            await conn.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + QUERIES["queue_stats"])
        )
        scans = [n for n in _nodes(explained["Plan"]) if n.get("Relation Name") == "runs"]
        read = sum(n["Actual Rows"] + n.get("Rows Removed by Filter", 0) for n in scans)
        assert scans, explained
        assert read < WAITING_RUNS / 10, explained

        answers = await _all(
            [client.resume(run_id, {"say": "yes"}, request_id=f"a-{run_id}") for run_id in run_ids]
        )
        assert not any(answer.duplicate for answer in answers)

        async def all_finished() -> bool:
            return (await _statuses(conn, run_ids)).get("finished") == WAITING_RUNS

        await eventually(all_finished, timeout=150, interval=0.5)
        run = await client.get(run_ids[-1])
        assert run.result == {"text": "", "answer": {"say": "yes"}, "attempt": 2}
    finally:
        await conn.close()
