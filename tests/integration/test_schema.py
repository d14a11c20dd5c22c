"""The schema in one place: the engine's functions and triggers are the files of
`sql/functions/`, applied after the migrations whenever their text changes, and the
committed `schema.sql` is what the migrations make."""

import logging
import re
from importlib import resources
from typing import Any

import asyncpg
import pytest

from runwire.infra.auth import database_url_as
from runwire.infra.schema import SCHEMA_FILE, committed_major, drift, render, server_major
from runwire.runtime.errors import MigrationsPending
from runwire.runtime.store import migrate

pytestmark = pytest.mark.integration

DEFINED = re.compile(r"^CREATE OR REPLACE (FUNCTION|TRIGGER) (\w+)", re.MULTILINE)
# A function the tests break, and what it answers when it is the files' definition.
BROKEN_RUN_AWAITS_ATTEMPT = """
    CREATE OR REPLACE FUNCTION run_awaits_attempt(p_status run_status) RETURNS boolean
    LANGUAGE sql IMMUTABLE AS $$ SELECT false $$
"""


def defined_in_files() -> dict[str, set[str]]:
    """The functions and triggers `sql/functions/*.sql` define, by kind."""
    found: dict[str, set[str]] = {"FUNCTION": set(), "TRIGGER": set()}
    folder = resources.files("runwire.runtime").joinpath("sql", "functions")
    for entry in folder.iterdir():
        for kind, name in DEFINED.findall(entry.read_text()):
            assert name not in found[kind], f"{kind} {name} is defined twice"
            found[kind].add(name)
    return found


async def _run_awaits_attempt(url: str) -> bool:
    conn = await asyncpg.connect(url)
    try:
        return bool(await conn.fetchval("SELECT run_awaits_attempt('queued')"))
    finally:
        await conn.close()


async def _execute(url: str, *statements: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


async def test_the_committed_schema_is_what_the_migrations_make(db_url: str) -> None:
    committed = SCHEMA_FILE.read_text()
    if committed_major(committed) != server_major():
        pytest.skip(f"schema.sql was dumped by PostgreSQL {committed_major(committed)}")
    assert not drift(committed, render(db_url)), "run make schema"


async def test_every_function_and_trigger_is_defined_in_sql_functions(db_url: str) -> None:
    conn = await asyncpg.connect(db_url)
    try:
        functions = await conn.fetch(
            "SELECT proname FROM pg_proc p WHERE pronamespace = 'public'::regnamespace AND "
            "NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = p.oid AND deptype = 'e')"
        )
        triggers = await conn.fetch("SELECT tgname FROM pg_trigger WHERE NOT tgisinternal")
    finally:
        await conn.close()
    files = defined_in_files()
    assert {r["proname"] for r in functions} == files["FUNCTION"]
    assert {r["tgname"] for r in triggers} == files["TRIGGER"]


async def test_a_function_changed_in_the_database_is_restored_when_its_text_is_new(
    db_url: str,
) -> None:
    assert await migrate(db_url) == []  # the template has this text: nothing to do
    # The database had other functions (an older runwire's), with another text.
    await _execute(db_url, BROKEN_RUN_AWAITS_ATTEMPT, "DELETE FROM schema_functions")
    assert not await _run_awaits_attempt(db_url)

    assert await migrate(db_url) == ["sql/functions"]
    assert await _run_awaits_attempt(db_url)
    assert await migrate(db_url) == []


async def test_a_service_older_than_the_functions_leaves_them_alone(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A newer runwire applied its functions after this version's.
    await _execute(
        db_url,
        BROKEN_RUN_AWAITS_ATTEMPT,
        "INSERT INTO schema_functions (digest, applied_at) "
        "VALUES ('a newer text', clock_timestamp() + interval '1 second')",
    )
    assert await migrate(db_url) == []
    assert not await _run_awaits_attempt(db_url)
    assert any("left as they are" in r.getMessage() for r in caplog.records)

    # The operator's runwire-migrate applies this version's over them.
    assert await migrate(db_url, replace_newer=True) == ["sql/functions"]
    assert await _run_awaits_attempt(db_url)


async def test_a_service_role_waits_for_the_owner_to_apply_the_functions(
    infra: Any, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    if not infra.service_roles:
        pytest.skip("the service roles log in without a password only on the embedded server")
    caplog.set_level(logging.WARNING)
    await _execute(db_url, "DELETE FROM schema_functions")
    with pytest.raises(MigrationsPending, match="run runwire-migrate"):
        await migrate(database_url_as(db_url, "runwire_executor"))
    assert await migrate(db_url) == ["sql/functions"]
    assert await migrate(database_url_as(db_url, "runwire_executor")) == []
    # What the role may not do is not half done: no text was recorded for it.
    conn = await asyncpg.connect(db_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM schema_functions") == 1
    finally:
        await conn.close()
