-- The outbox's queries: what a committed transaction implies, the sweep, deleting what
-- was published. (The rows themselves are written by the triggers of migration 0009;
-- run events are the run_events rows.)
-- Named queries: `-- name: <name>` starts one.

-- name: outbox_lock
-- One sweep of the outbox at a time (for this transaction): two publishing disjoint
-- batches at once could put a run's later event in the stream before an earlier one.
SELECT pg_try_advisory_xact_lock($1) AS locked;

-- name: outbox_of_xacts
-- What committed transactions imply that their service publishes at once: their jobs
-- and frames that were due when written (run events and later jobs are the sweep's).
SELECT xact::text AS xact, id, kind, tenant, run_id, msg_id, body::text AS body,
       trace_parent, body->>'runner' AS runner
  FROM outbox
 WHERE xact = ANY($1::text[]::xid8[]) AND kind <> 'event' AND due_at <= created_at
 ORDER BY id;

-- name: archived_seq
-- Where a run's frames continue when the frames stream holds none of them any more.
SELECT last_seq, frames_closed FROM runs WHERE run_id = $1::uuid;

-- name: outbox_due
-- The sweep's outbox rows, oldest first (the caller holds outbox_lock): rows that became
-- due after they were written, and rows their service left (after $1 ms).
SELECT id, kind, tenant, run_id, msg_id, body::text AS body, trace_parent,
       body->>'runner' AS runner
  FROM outbox
 WHERE due_at <= now()
   AND (due_at > created_at OR created_at < now() - make_interval(secs => $1 / 1000.0))
 ORDER BY id
 LIMIT $2
   FOR UPDATE SKIP LOCKED;

-- name: events_due
-- The oldest transitions not yet published as run events (the caller holds
-- outbox_lock; the row locks keep an older version's publisher off them too), each as
-- its message: `event:<run_id>:<row id>`, the RunEvent body. The oldest are found by
-- the partial index of unpublished events, in id order, before the join: a backlog of
-- thousands costs what the batch costs, not a join and a sort of the whole backlog.
WITH due AS MATERIALIZED (
    SELECT id, run_id, event, status, attempt, code, at, seq, node_id
      FROM run_events
     WHERE published_at IS NULL
     ORDER BY id
     LIMIT $1
       FOR UPDATE SKIP LOCKED
)
SELECT e.id, 'event' AS kind, r.tenant, e.run_id, 'event:' || e.run_id || ':' || e.id AS msg_id,
       (jsonb_build_object('v', 1, 'run_id', e.run_id, 'session_id', r.session_id,
                          'event', e.event, 'status', e.status, 'attempt', e.attempt,
                          'code', e.code, 'at', rfc3339(e.at))
       || CASE WHEN e.seq IS NULL THEN '{}'::jsonb
               ELSE jsonb_build_object('node', e.node_id, 'seq', e.seq) END)::text AS body,
       r.trace_parent
  FROM due e JOIN runs r USING (run_id)
 ORDER BY e.id;

-- name: events_published
UPDATE run_events SET published_at = now() WHERE id = ANY($1::bigint[]);

-- name: outbox_delete
-- Published: the rows are done (deleted in run id order, see migration 0022).
SELECT outbox_done($1::bigint[]);
