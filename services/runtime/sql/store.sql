-- Reads every service shares, and the schema's own upkeep (migrations, checks).
-- Named queries: `-- name: <name>` starts one.

-- name: get_run
SELECT * FROM runs WHERE tenant = $1 AND run_id = $2;

-- name: get_run_by_id
SELECT * FROM runs WHERE run_id = $1;

-- name: ping
SELECT 1 AS ok;

-- name: learn_types
-- Prepared by every pooled connection as it opens (never run): it names each type of
-- runwire's statements that asyncpg does not know by itself, runwire's enums and the
-- arrays of any type (asyncpg asks Postgres about array types too), so that the
-- connection learns them all in one lookup instead of one lookup (milliseconds) per
-- type the first time a statement uses it, in the middle of a run's work.
SELECT NULL::run_status, NULL::run_status[], NULL::outbox_kind, NULL::outbox_kind[],
       NULL::effect_state, NULL::effect_state[], NULL::node_status, NULL::node_status[],
       NULL::text[], NULL::integer[], NULL::bigint[], NULL::uuid[], NULL::boolean[],
       NULL::jsonb[], NULL::timestamptz[];

-- name: events_timeline
-- Every recorded transition, oldest first (for audits and tests).
SELECT run_id, event, status, attempt, actor, code, reason, at FROM run_events ORDER BY at, id;

-- name: run_events
-- One run's recorded transitions, in the order they were written (for audits and tests).
SELECT event, status, attempt, actor, code, reason, at, node_id, seq, idempotency_key
  FROM run_events WHERE run_id = $1 ORDER BY id;

-- name: run_status_values
SELECT enumlabel FROM pg_enum e JOIN pg_type t ON t.oid = e.enumtypid
 WHERE t.typname = 'run_status' ORDER BY e.enumsortorder;

-- name: migration_lock
SELECT pg_advisory_lock($1);

-- name: migration_unlock
SELECT pg_advisory_unlock($1);

-- name: migrations_table_exists
SELECT to_regclass('schema_migrations') IS NOT NULL;

-- name: migrations_table
CREATE TABLE IF NOT EXISTS schema_migrations (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

-- name: migrations_applied
SELECT version FROM schema_migrations;

-- name: migration_done
INSERT INTO schema_migrations (version, name) VALUES ($1, $2);

-- name: functions_applied
-- The texts of sql/functions/ the database has had (their digests), the current first.
SELECT digest FROM schema_functions ORDER BY applied_at DESC, digest;

-- name: functions_done
INSERT INTO schema_functions (digest) VALUES ($1)
ON CONFLICT (digest) DO UPDATE SET applied_at = clock_timestamp();
