"""The Postgres store: the only package that talks to asyncpg.

Queries are named and live in `sql/*.sql`, a file per service that uses them, as do the
query sets over them (submits, attempts, upkeep, segments, outbox); migrations are
numbered files in `migrations/`, applied at start-up under an advisory lock. Every
transition is one guarded statement: a method returns the changed run, or None /
LostRace when the guard did not hold (another writer or a newer attempt got there first).
"""

from runwire.runtime.store.locks import EXECUTOR_PRESENCE_LOCKS, KeptLockSession, LockSession
from runwire.runtime.store.rows import (
    BudgetGrant,
    Effect,
    OutboxBatch,
    OutboxKind,
    OutboxMessage,
    Run,
    Segment,
    SegmentCount,
    SegmentText,
    StoredSegment,
    parse_run_id,
)
from runwire.runtime.store.schema import QUERIES, load_queries, migrate
from runwire.runtime.store.store import Store

__all__ = [
    "EXECUTOR_PRESENCE_LOCKS",
    "QUERIES",
    "BudgetGrant",
    "Effect",
    "KeptLockSession",
    "LockSession",
    "OutboxBatch",
    "OutboxKind",
    "OutboxMessage",
    "Run",
    "Segment",
    "SegmentCount",
    "SegmentText",
    "Store",
    "StoredSegment",
    "load_queries",
    "migrate",
    "parse_run_id",
]
