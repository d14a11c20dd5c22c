"""Several relays at once: each run's frames in order, none published twice."""

import asyncio

import asyncpg
import pytest

from runwire.relay.partitions import PARTITION_LOCKS
from runwire.runtime.broker import RELAY_PARTITIONS
from runwire.testing.waiting import eventually
from tests.services import InProcessStack, assert_well_formed, collect

pytestmark = pytest.mark.integration


async def _partitions_by_relay(db_url: str) -> list[int]:
    conn = await asyncpg.connect(db_url)
    try:
        rows = await conn.fetch(
            "SELECT pid, count(*) AS n FROM pg_locks WHERE locktype = 'advisory'"
            " AND granted AND classid = $1::integer::oid"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " GROUP BY pid",
            PARTITION_LOCKS,
        )
    finally:
        await conn.close()
    return sorted(r["n"] for r in rows)


async def test_two_relays_share_partitions_and_keep_every_run_in_order(
    stack: InProcessStack,
) -> None:
    stack.start_relay("relay-2")
    half = RELAY_PARTITIONS // 2
    await eventually(lambda: _shared(stack.db_url, [half, half]), timeout=15, interval=0.2)
    scripts = [{"tokens": [f"{i}/{t} " for t in range(40)], "token_delay_ms": 5} for i in range(12)]
    ids = [(await stack.client.submit(s)).run.run_id for s in scripts]

    results = await asyncio.gather(*(collect(stack.client, r, timeout=60) for r in ids))

    for i, (frames, transcript) in enumerate(results):
        assert_well_formed(frames)
        assert transcript.text == "".join(scripts[i]["tokens"])  # type: ignore[arg-type]


async def _shared(db_url: str, expected: list[int]) -> bool:
    return await _partitions_by_relay(db_url) == expected


async def test_a_stopped_relay_hands_its_partitions_over_mid_stream(
    stack: InProcessStack,
) -> None:
    stack.start_relay("relay-2")
    half = RELAY_PARTITIONS // 2
    await eventually(lambda: _shared(stack.db_url, [half, half]), timeout=15, interval=0.2)
    scripts = [{"tokens": [f"{i}|{t} " for t in range(60)], "token_delay_ms": 20} for i in range(8)]
    ids = [(await stack.client.submit(s)).run.run_id for s in scripts]
    streams = [asyncio.create_task(collect(stack.client, r, timeout=60)) for r in ids]
    await eventually(lambda: _started(stack, ids), timeout=15)

    await stack.stop_service("relay-2")
    results = await asyncio.gather(*streams)

    assert await _partitions_by_relay(stack.db_url) == [RELAY_PARTITIONS]
    for i, (frames, transcript) in enumerate(results):
        assert_well_formed(frames)
        assert transcript.text == "".join(scripts[i]["tokens"])  # type: ignore[arg-type]


async def _started(stack: InProcessStack, ids: list[str]) -> bool:
    for run_id in ids:
        if len((await stack.client.join(run_id, 0)).replay) < 3:
            return False
    return True
