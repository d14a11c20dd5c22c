"""The schema and its queries: named SQL loaded from `sql/*.sql`; numbered migrations
from `migrations/`, which change tables; and the engine's functions and triggers, whose
current definitions are the files of `sql/functions/`. Both are applied at start-up
under an advisory lock: the migrations not applied yet, then the functions whenever
their text is one the database has never had.

Migrations up to LAST_MIGRATION_WITH_FUNCTIONS are history: they created and replaced
functions before `sql/functions/` held them, and are never edited. A later migration
only changes tables (a test keeps it so); a function changes in its file.
"""

import hashlib
import json
import logging
import re
from importlib import resources

import asyncpg

from runwire.runtime.errors import MigrationFailed, MigrationsPending

log = logging.getLogger(__name__)

MIGRATION_LOCK_KEY = 7_240_113_001
# The last migration that defines functions or triggers; later ones change tables only.
LAST_MIGRATION_WITH_FUNCTIONS = 27
_NAME_LINE = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def load_queries(text: str) -> dict[str, str]:
    """Split a `.sql` file into its named queries."""
    parts = _NAME_LINE.split(text)
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def load_all() -> dict[str, str]:
    """Every named query of `sql/*.sql` (one file per service that uses them); a name
    defined twice is an error."""
    queries: dict[str, str] = {}
    folder = resources.files("runwire.runtime").joinpath("sql")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        for name, sql in load_queries(entry.read_text()).items():
            if name in queries:
                raise ValueError(f"query {name} is defined twice (again in {entry.name})")
            queries[name] = sql
    return queries


QUERIES = load_all()


async def init_connection(conn: asyncpg.Connection) -> None:
    for json_type in ("json", "jsonb"):
        await conn.set_type_codec(
            json_type, encoder=json.dumps, decoder=json.loads, schema="pg_catalog"
        )
    # Every type of runwire's statements, learned in one lookup (see `learn_types`).
    await conn.prepare(QUERIES["learn_types"])


def _migrations() -> list[tuple[int, str, str]]:
    folder = resources.files("runwire.runtime").joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        match = re.match(r"^(\d+)_\w+\.sql$", entry.name)
        if match:
            found.append((int(match.group(1)), entry.name, entry.read_text()))
    return sorted(found)


def functions_text() -> tuple[str, str]:
    """The text of `sql/functions/*.sql` in file-name order, and its digest."""
    folder = resources.files("runwire.runtime").joinpath("sql", "functions")
    files = sorted(
        (entry for entry in folder.iterdir() if entry.name.endswith(".sql")),
        key=lambda e: e.name,
    )
    text = "\n".join(entry.read_text() for entry in files)
    return text, hashlib.sha256(text.encode()).hexdigest()


async def _apply_functions(conn: asyncpg.Connection, *, replace_newer: bool) -> bool:
    """Create or replace the engine's functions and triggers unless the database has this
    text of them already; True when it applied them.

    A text the database had before, replaced since by another, is left alone unless
    `replace_newer`: that is a service older than the last `runwire-migrate`, and its
    functions would undo the newer ones.
    """
    text, digest = functions_text()
    history = [r["digest"] for r in await conn.fetch(QUERIES["functions_applied"])]
    if history and history[0] == digest:
        return False
    if digest in history and not replace_newer:
        log.warning(
            "the database's functions were replaced since this service's version of them "
            "was applied; left as they are (runwire-migrate applies this version's)"
        )
        return False
    try:
        async with conn.transaction():
            # Bodies refer to each other across files: checked when called, not here.
            await conn.execute("SET LOCAL check_function_bodies = off")
            await conn.execute(text)
            await conn.execute(QUERIES["functions_done"], digest)
    except asyncpg.InsufficientPrivilegeError as exc:
        raise MigrationsPending(
            f"the engine's functions in this version are not applied, and this role "
            f"({exc}) may not apply them: run runwire-migrate as the owner of the schema"
        ) from exc
    except asyncpg.PostgresError as exc:
        if isinstance(exc, asyncpg.PostgresConnectionError):
            raise
        raise MigrationFailed(f"the engine's functions failed, none applied: {exc}") from exc
    log.info("applied the engine's functions (%s)", digest[:12])
    return True


async def migrate(dsn: str, *, replace_newer: bool = False) -> list[str]:
    """Apply every migration not yet applied, then the engine's functions when the
    database lacks them, under an advisory lock; return the names of what it applied.
    `replace_newer`: apply this version's functions even over newer ones (an operator's
    `runwire-migrate`)."""
    conn = await asyncpg.connect(dsn)
    applied: list[str] = []
    try:
        await conn.execute(QUERIES["migration_lock"], MIGRATION_LOCK_KEY)
        try:
            # A service's own role may not create tables: it only reads which are applied.
            if not await conn.fetchval(QUERIES["migrations_table_exists"]):
                try:
                    await conn.execute(QUERIES["migrations_table"])
                except asyncpg.InsufficientPrivilegeError as exc:
                    raise MigrationsPending(
                        f"the database has no migrations applied, and this role ({exc}) may "
                        "not apply them: run runwire-migrate as the owner of the schema"
                    ) from exc
            done = {r["version"] for r in await conn.fetch(QUERIES["migrations_applied"])}
            for version, name, sql in _migrations():
                if version in done:
                    continue
                try:
                    async with conn.transaction():
                        await conn.execute(sql)
                        await conn.execute(QUERIES["migration_done"], version, name)
                except (asyncpg.PostgresConnectionError, asyncpg.InterfaceError):
                    raise  # Postgres went away: trying again may help
                except asyncpg.InsufficientPrivilegeError as exc:
                    # A service connected as its own role: the owner applies migrations
                    # (`runwire-migrate`, or `make up`); wait for it.
                    raise MigrationsPending(
                        f"migration {name} is not applied, and this role ({exc}) may not "
                        "apply it: run runwire-migrate as the owner of the schema"
                    ) from exc
                except asyncpg.PostgresError as exc:
                    raise MigrationFailed(
                        f"migration {name} failed, nothing of it applied: {exc}"
                    ) from exc
                applied.append(name)
                log.info("applied migration %s", name)
            if await _apply_functions(conn, replace_newer=replace_newer):
                applied.append("sql/functions")
        finally:
            await conn.execute(QUERIES["migration_unlock"], MIGRATION_LOCK_KEY)
    finally:
        await conn.close()
    return applied
