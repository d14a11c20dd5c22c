"""The Postgres schema: statuses agree with the contract; migrations are safe to re-run."""

from pathlib import Path

import asyncpg
import pytest

import services.runtime
from contracts.status import RunStatus
from services.runtime.store import Store, migrate
from tests.conftest import TestInfra

pytestmark = pytest.mark.integration


async def test_run_status_enum_matches_the_contract(db_url: str) -> None:
    store = await Store.connect(db_url, pool_size=1)
    try:
        assert await store.run_status_values() == [s.value for s in RunStatus]
    finally:
        await store.close()


async def _schema(url: str) -> list[tuple[str, str, str, str]]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT table_name, column_name, data_type, is_nullable"
            " FROM information_schema.columns WHERE table_schema = 'public'"
            " ORDER BY table_name, column_name"
        )
    finally:
        await conn.close()
    return [tuple(r) for r in rows]


async def test_fresh_and_migrated_databases_have_the_same_schema(
    infra: TestInfra, db_url: str
) -> None:
    # db_url was copied from the template migrated at session start; run migrate again
    # (a restart of a service) and on an empty database, and compare.
    assert await migrate(db_url) == []
    name = "fresh_" + db_url.rsplit("/", 1)[1]
    conn = await asyncpg.connect(infra.admin_url)
    await conn.execute(f'CREATE DATABASE "{name}"')
    await conn.close()
    try:
        fresh = infra.database_url(name)
        folder = Path(services.runtime.__file__).parent / "migrations"
        assert await migrate(fresh) == sorted(p.name for p in folder.glob("*.sql"))
        assert await _schema(fresh) == await _schema(db_url)
    finally:
        await infra.drop_database(name)


async def test_every_named_query_prepares(db_url: str) -> None:
    """Catches a query whose parameters or columns do not fit the schema."""
    from services.runtime.store import QUERIES

    conn = await asyncpg.connect(db_url)
    try:
        for name, sql in QUERIES.items():
            try:
                await conn.prepare(sql)
            except asyncpg.PostgresError as exc:
                pytest.fail(f"query {name} does not prepare: {exc}")
    finally:
        await conn.close()
