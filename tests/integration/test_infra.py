"""The test fixtures give every test real, JetStream-enabled NATS and a Postgres database
of its own, copied from the migrated template."""

from __future__ import annotations

import asyncpg
import nats
import pytest

from runwire.client.settings import server_urls
from runwire.contracts.subjects import PREFIX_PATTERN
from runwire.testing.servers import Servers

pytestmark = pytest.mark.integration

EIGHT_MEGABYTES = 8 * 1024 * 1024


async def test_nats_stores_messages_in_jetstream(infra: Servers, prefix: str) -> None:
    assert PREFIX_PATTERN.match(prefix)
    client = await nats.connect(server_urls(infra.nats_url))
    try:
        assert client.max_payload == EIGHT_MEGABYTES
        js = client.jetstream()
        stream = f"PROBE_{prefix.upper()}"
        await js.add_stream(name=stream, subjects=[f"{prefix}.probe.>"])
        try:
            ack = await js.publish(f"{prefix}.probe.one", b"hello")
            assert (ack.stream, ack.seq) == (stream, 1)
            stored = await js.get_msg(stream, 1)
            assert stored.data == b"hello"
        finally:
            await js.delete_stream(stream)
    finally:
        await client.close()


@pytest.mark.parametrize("turn", [1, 2])
async def test_each_test_gets_a_fresh_migrated_database(db_url: str, turn: int) -> None:
    conn = await asyncpg.connect(db_url)
    try:
        name = await conn.fetchval("SELECT current_database()")
        assert name.startswith("t_")
        assert db_url.endswith(f"/{name}")
        # Copied from the template, so the migrations are already there.
        assert await conn.fetchval("SELECT count(*) FROM schema_migrations") >= 1
        # Fails with DuplicateTableError if the other turn's database were reused.
        await conn.execute("CREATE TABLE probe (turn integer)")
        await conn.execute("INSERT INTO probe VALUES ($1)", turn)
    finally:
        await conn.close()


async def test_databases_are_distinct_and_dropped(infra: Servers, db_url: str) -> None:
    other_url = await infra.create_database()
    other_name = other_url.rsplit("/", 1)[1]
    try:
        assert other_url != db_url
        mine = await asyncpg.connect(db_url)
        other = await asyncpg.connect(other_url)
        try:
            await mine.execute("CREATE TABLE only_here (x integer)")
            assert await other.fetchval("SELECT to_regclass('only_here')") is None
        finally:
            await mine.close()
            await other.close()
    finally:
        await infra.drop_database(other_name)
    admin = await asyncpg.connect(infra.admin_url)
    try:
        left = await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", other_name)
    finally:
        await admin.close()
    assert left is None


def test_service_env_points_services_at_this_test(
    service_env: dict[str, str], infra: Servers, db_url: str, prefix: str
) -> None:
    assert service_env["RUNWIRE_NATS_URL"] == infra.nats_url
    assert service_env["RUNWIRE_DATABASE_URL"] == db_url
    assert service_env["RUNWIRE_PREFIX"] == prefix
    assert service_env["PATH"]
