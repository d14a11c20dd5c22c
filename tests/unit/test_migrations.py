"""Migrations change tables; the engine's functions and triggers change in their files
(`sql/functions/`). Migrations up to LAST_MIGRATION_WITH_FUNCTIONS are history."""

import re
from importlib import resources

from runwire.runtime.store.schema import LAST_MIGRATION_WITH_FUNCTIONS

DEFINES = re.compile(
    r"^\s*(CREATE\s+(OR\s+REPLACE\s+)?(FUNCTION|TRIGGER|CONSTRAINT\s+TRIGGER)|"
    r"ALTER\s+FUNCTION)\b",
    re.IGNORECASE | re.MULTILINE,
)


def migrations() -> dict[int, str]:
    folder = resources.files("runwire.runtime").joinpath("migrations")
    found = {}
    for entry in folder.iterdir():
        match = re.match(r"^(\d+)_\w+\.sql$", entry.name)
        if match:
            found[int(match.group(1))] = entry.read_text()
    return found


def test_later_migrations_define_no_function_or_trigger() -> None:
    later = {n: sql for n, sql in migrations().items() if n > LAST_MIGRATION_WITH_FUNCTIONS}
    assert later, "no migration after the history: the test would check nothing"
    offending = {n: DEFINES.findall(sql) for n, sql in later.items() if DEFINES.search(sql)}
    assert not offending, f"define these in sql/functions/ instead: {offending}"


def test_the_history_ends_where_it_says() -> None:
    last = migrations()[LAST_MIGRATION_WITH_FUNCTIONS]
    assert DEFINES.search(last), "the last migration of the history defines a function"
