-- Named queries: `-- name: <name>` starts one. Every transition is one guarded
-- statement that also appends its run_events row.

-- name: insert_run
WITH ins AS (
    -- A run whose session is busy gets no job yet (job_published_at NULL): it gets one
    -- when its turn comes (release_session_turn). clock_timestamp(), not now() (the transaction's
    -- start, before a wait for the session's lock): runs of a session are created in
    -- the order they were accepted.
    INSERT INTO runs (run_id, tenant, request_id, session_id, multitask, runner, input,
                      metadata, max_attempts, attempt_timeout_ms, queue_timeout_ms,
                      job_published_at, created_at, updated_at, trace_parent)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11,
            CASE WHEN session_blocked($2, $4, NULL) THEN NULL ELSE now() END,
            clock_timestamp(), clock_timestamp(), $13)
    ON CONFLICT (tenant, request_id) DO NOTHING
    RETURNING *
), ev AS (
    INSERT INTO run_events (run_id, event, status, attempt, actor, reason, at)
    SELECT run_id, 'submitted', status, attempts, $12,
           CASE WHEN job_published_at IS NULL THEN 'submit; waits for its session'
                ELSE 'submit' END,
           created_at
      FROM ins
)
SELECT *, pg_current_xact_id()::text AS xact FROM ins;

-- name: frame_states
-- The relay's starting point for runs it has no cursor for.
SELECT run_id, last_seq, frames_closed FROM runs WHERE run_id = ANY($1::uuid[]);

-- name: run_by_request
SELECT * FROM runs WHERE tenant = $1 AND request_id = $2;

-- name: get_run
SELECT * FROM runs WHERE tenant = $1 AND run_id = $2;

-- name: get_run_by_id
SELECT * FROM runs WHERE run_id = $1;

-- name: claim_run
-- Starts an attempt: a new generation fences every write of earlier attempts. A run never
-- starts while an earlier run of its session holds the session.
WITH upd AS (
    UPDATE runs
       SET status = 'running', attempts = attempts + 1, generation = generation + 1,
           lease_owner = $3, lease_expires_at = now() + make_interval(secs => $4 / 1000.0),
           job_ack = $5, close_seq = NULL, started_at = coalesce(started_at, now()),
           updated_at = now()
     WHERE run_id = $1 AND generation = $2 AND status IN ('queued', 'recovering')
       AND NOT cancel_requested AND not_before <= now()
       AND (attempts > 0 OR queue_timeout_ms IS NULL
            OR created_at + make_interval(secs => queue_timeout_ms / 1000.0) > now())
       AND NOT session_blocked(tenant, session_id, submit_seq)
    RETURNING *
), ev AS (
    INSERT INTO run_events (run_id, event, status, attempt, actor, reason)
    SELECT run_id, 'claimed', status, attempts, $3, 'attempt started' FROM upd
)
SELECT * FROM upd;

-- name: heartbeat
UPDATE runs
   SET lease_expires_at = now() + make_interval(secs => $3 / 1000.0),
       partial_text = $4, updated_at = now()
 WHERE run_id = $1 AND generation = $2 AND status = 'running'
RETURNING cancel_requested;

-- name: save_checkpoint
UPDATE runs
   SET checkpoint = $3, checkpoint_version = checkpoint_version + 1,
       partial_text = $4, updated_at = now()
 WHERE run_id = $1 AND generation = $2 AND status = 'running'
RETURNING checkpoint_version;

-- name: finish_run
WITH upd AS (
    UPDATE runs
       SET status = 'finished', result = $3, partial_text = $4, error = NULL, close_seq = $6,
           implied_trace_parent = $7, lease_owner = NULL, lease_expires_at = NULL, ended_at = now(), updated_at = now()
     WHERE run_id = $1 AND generation = $2 AND status = 'running'
    RETURNING *
), ev AS (
    INSERT INTO run_events (run_id, event, status, attempt, actor, reason)
    SELECT run_id, 'finished', status, attempts, $5, 'runner returned' FROM upd
)
SELECT *, pg_current_xact_id()::text AS xact FROM upd;

-- name: close_attempt
-- Ends a running attempt in a terminal status ('failed' or 'canceled') with an error.
WITH upd AS (
    UPDATE runs
       SET status = $3::run_status, error = $4, partial_text = $5, close_seq = $7,
           implied_trace_parent = $8, lease_owner = NULL, lease_expires_at = NULL, ended_at = now(), updated_at = now()
     WHERE run_id = $1 AND generation = $2 AND status = 'running'
    RETURNING *
), ev AS (
    INSERT INTO run_events (run_id, event, status, attempt, actor, code, reason)
    SELECT run_id, $3, status, attempts, $6, $4->>'code', $4->>'message' FROM upd
)
SELECT *, pg_current_xact_id()::text AS xact FROM upd;

-- name: cancel_attempt
-- A running attempt stopped for a cancel: closed with the error its canceller chose.
WITH upd AS (
    UPDATE runs
       SET status = 'canceled', error = coalesce(cancel_error, $3), partial_text = $4,
           close_seq = $6, implied_trace_parent = $7, lease_owner = NULL, lease_expires_at = NULL, ended_at = now(), updated_at = now()
     WHERE run_id = $1 AND generation = $2 AND status = 'running'
    RETURNING *
), ev AS (
    INSERT INTO run_events (run_id, event, status, attempt, actor, code, reason)
    SELECT run_id, 'canceled', status, attempts, $5, error->>'code', error->>'message' FROM upd
)
SELECT *, pg_current_xact_id()::text AS xact FROM upd;

-- name: requeue_run
-- A retryable failure with attempts left: back to the queue after a delay. Its job waits
-- in the outbox until due (a job that waits in an executor would hold a slot of the
-- global in-flight limit). A cancel that arrived meanwhile closes the run instead.
WITH upd AS (
    UPDATE runs
       SET status = CASE WHEN cancel_requested THEN 'canceled'::run_status
                         ELSE 'queued'::run_status END,
           error = CASE WHEN cancel_requested THEN coalesce(cancel_error, $7) ELSE $3 END,
           ended_at = CASE WHEN cancel_requested THEN now() END,
           partial_text = $4,
           not_before = now() + make_interval(secs => $5 / 1000.0),
           lease_owner = NULL, lease_expires_at = NULL, close_seq = $8,
           implied_trace_parent = $9, job_published_at = now(), updated_at = now()
     WHERE run_id = $1 AND generation = $2 AND status = 'running'
    RETURNING *
), ev AS (
    INSERT INTO run_events (run_id, event, status, attempt, actor, code, reason)
    SELECT run_id, CASE WHEN status = 'canceled' THEN 'canceled' ELSE 'retry' END, status,
           attempts, $6, error->>'code', error->>'message' FROM upd
)
SELECT *, pg_current_xact_id()::text AS xact FROM upd;
-- name: release_run
-- Shutdown: the attempt goes back to the queue and is not counted (or, when a cancel
-- arrived meanwhile, the run is closed as canceled).
WITH upd AS (
    UPDATE runs
       SET status = CASE WHEN cancel_requested THEN 'canceled'::run_status
                         ELSE 'queued'::run_status END,
           error = CASE WHEN cancel_requested THEN coalesce(cancel_error, $5) ELSE error END,
           ended_at = CASE WHEN cancel_requested THEN now() END,
           attempts = attempts - 1, partial_text = $3,
           not_before = now(), lease_owner = NULL, lease_expires_at = NULL,
           close_seq = CASE WHEN cancel_requested THEN $6::integer END,
           implied_trace_parent = $7, job_published_at = now(), updated_at = now()
     WHERE run_id = $1 AND generation = $2 AND status = 'running'
    RETURNING *
), ev AS (
    INSERT INTO run_events (run_id, event, status, attempt, actor, code, reason)
    SELECT run_id, CASE WHEN status = 'canceled' THEN 'canceled' ELSE 'released' END, status,
           attempts, $4, error->>'code', 'executor shutting down' FROM upd
)
SELECT *, pg_current_xact_id()::text AS xact FROM upd;

-- name: request_cancel
-- A queued run is canceled at once; a running one is flagged for its executor, which
-- closes it with the error chosen here (the first cancel's), and stops holding its
-- session after $5 ms even if its executor never answers.
WITH upd AS (
    UPDATE runs
       SET cancel_requested = true,
           cancel_error = coalesce(cancel_error, $3),
           cancel_deadline = coalesce(cancel_deadline, now() + make_interval(secs => $5 / 1000.0)),
           status = CASE WHEN status = 'running' THEN status ELSE 'canceled'::run_status END,
           error = CASE WHEN status = 'running' THEN error ELSE coalesce(cancel_error, $3) END,
           ended_at = CASE WHEN status = 'running' THEN ended_at ELSE now() END,
           close_seq = NULL, updated_at = now()
     WHERE tenant = $1 AND run_id = $2 AND status IN ('queued', 'running', 'recovering')
    RETURNING *
), ev AS (
    INSERT INTO run_events (run_id, event, status, attempt, actor, code, reason)
    SELECT run_id, 'cancel_requested', status, attempts, $4, cancel_error->>'code',
           cancel_error->>'message'
      FROM upd
)
SELECT *, pg_current_xact_id()::text AS xact FROM upd;

-- name: cancel_session
-- request_cancel for every queued, running or recovering run of a session at once (an
-- interrupt or abort_session, under the session's lock), oldest first.
WITH upd AS (
    UPDATE runs
       SET cancel_requested = true,
           cancel_error = coalesce(cancel_error, $3),
           cancel_deadline = coalesce(cancel_deadline, now() + make_interval(secs => $4 / 1000.0)),
           status = CASE WHEN status = 'running' THEN status ELSE 'canceled'::run_status END,
           error = CASE WHEN status = 'running' THEN error ELSE coalesce(cancel_error, $3) END,
           ended_at = CASE WHEN status = 'running' THEN ended_at ELSE now() END,
           close_seq = NULL, updated_at = now()
     WHERE tenant = $1 AND session_id = $2 AND status IN ('queued', 'running', 'recovering')
    RETURNING *
), ev AS (
    INSERT INTO run_events (run_id, event, status, attempt, actor, code, reason)
    SELECT run_id, 'cancel_requested', status, attempts, $5, cancel_error->>'code',
           cancel_error->>'message'
      FROM upd
)
SELECT *, pg_current_xact_id()::text AS xact FROM upd ORDER BY submit_seq;

-- name: release_sessions
-- Sessions whose next run may start although no run of theirs ended: a canceled run
-- still running past its grace no longer holds its session. Their runs get their job.
SELECT coalesce(sum(release_session_turn(s.tenant, s.session_id, $2)), 0)::integer AS released
  FROM (SELECT DISTINCT tenant, session_id FROM runs
         WHERE status = 'queued' AND job_published_at IS NULL
           AND NOT session_blocked(tenant, session_id, submit_seq)
         LIMIT $1) s;

-- name: fail_queued
-- A run that never reached an attempt fails (queue full or queue timeout).
WITH upd AS (
    UPDATE runs
       SET status = 'failed', error = $2, close_seq = NULL, ended_at = now(),
           updated_at = now()
     WHERE run_id = $1 AND status = 'queued' AND attempts = 0
    RETURNING *
), ev AS (
    INSERT INTO run_events (run_id, event, status, attempt, actor, code, reason)
    SELECT run_id, 'failed', status, attempts, $3, $2->>'code', $2->>'message' FROM upd
)
SELECT *, pg_current_xact_id()::text AS xact FROM upd;

-- name: expire_leases
-- Running runs whose executor stopped renewing its lease: recover them, or close them
-- as interrupted after too many recoveries without checkpoint progress.
WITH due AS (
    SELECT run_id, cancel_requested AS canceled,
           (checkpoint_version = recovery_checkpoint AND recoveries + 1 > $2) AS stalled
      FROM runs
     WHERE status = 'running' AND lease_expires_at < now()
     ORDER BY lease_expires_at
     LIMIT $1
     FOR UPDATE SKIP LOCKED
), upd AS (
    UPDATE runs r
       SET recoveries = CASE WHEN r.checkpoint_version > r.recovery_checkpoint
                             THEN 1 ELSE r.recoveries + 1 END,
           recovery_checkpoint = r.checkpoint_version,
           -- A run whose cancel was asked before its executor died is closed, not resumed.
           status = CASE WHEN due.canceled THEN 'canceled'::run_status
                         WHEN due.stalled THEN 'interrupted'::run_status
                         ELSE 'recovering'::run_status END,
           error = CASE WHEN due.canceled THEN coalesce(r.cancel_error, $6)
                        WHEN due.stalled THEN $4 ELSE r.error END,
           ended_at = CASE WHEN due.canceled OR due.stalled THEN now() END,
           not_before = now() + make_interval(secs => $3 / 1000.0),
           lease_owner = NULL, lease_expires_at = NULL, close_seq = NULL,
           implied_trace_parent = NULL, job_published_at = now(), updated_at = now()
      FROM due
     WHERE r.run_id = due.run_id
    RETURNING r.*
), ev AS (
    INSERT INTO run_events (run_id, event, status, attempt, actor, code, reason)
    SELECT run_id, status::text, status, attempts, $5, error->>'code', 'lease expired'
      FROM upd
)
SELECT *, pg_current_xact_id()::text AS xact FROM upd;

-- name: stale_jobs
-- Runs that have waited for an attempt longer than $1 ms since their job was issued or
-- last checked: the caller checks the stream for their job. Marked as checked.
UPDATE runs r
   SET job_checked_at = now()
 WHERE r.run_id IN (
        SELECT run_id FROM runs
         WHERE status IN ('queued', 'recovering') AND NOT cancel_requested
           AND job_published_at IS NOT NULL AND not_before <= now()
           AND greatest(job_published_at, job_checked_at)
               < now() - make_interval(secs => $1 / 1000.0)
         LIMIT $2
         FOR UPDATE SKIP LOCKED)
RETURNING r.run_id;

-- name: reissue_jobs
-- Runs whose job is gone from the stream (deleted or purged): each gets a new job.
UPDATE runs
   SET job_published_at = now(), implied_trace_parent = NULL, updated_at = now()
 WHERE run_id = ANY($1::uuid[]) AND status IN ('queued', 'recovering')
   AND NOT cancel_requested AND job_published_at IS NOT NULL
RETURNING run_id, pg_current_xact_id()::text AS xact;

-- name: expire_queue
WITH due AS (
    SELECT run_id FROM runs
     WHERE status = 'queued' AND attempts = 0 AND queue_timeout_ms IS NOT NULL
       AND created_at + make_interval(secs => queue_timeout_ms / 1000.0) <= now()
     LIMIT $1
     FOR UPDATE SKIP LOCKED
), upd AS (
    UPDATE runs r
       SET status = 'failed', error = $2, close_seq = NULL, ended_at = now(),
           updated_at = now()
      FROM due WHERE r.run_id = due.run_id
    RETURNING r.*
), ev AS (
    INSERT INTO run_events (run_id, event, status, attempt, actor, code, reason)
    SELECT run_id, 'failed', status, attempts, $3, 'QUEUE_TIMEOUT', 'queue timeout' FROM upd
)
SELECT *, pg_current_xact_id()::text AS xact FROM upd;

-- name: queue_stats
-- Per tenant: runs waiting for an attempt, and the age of the oldest (since its submit).
SELECT tenant, count(*) AS depth,
       extract(epoch FROM now() - min(created_at))::float8 AS oldest_age_s
  FROM runs
 WHERE status IN ('queued', 'recovering')
 GROUP BY tenant;

-- name: session_active
SELECT run_id FROM runs
 WHERE tenant = $1 AND session_id = $2 AND status IN ('queued', 'running', 'recovering')
 ORDER BY submit_seq;

-- name: lock_session
-- Serializes the submits (and aborts) of one session until the transaction ends. The
-- one-bigint key form never meets the two-integer keys of the relay's locks.
SELECT pg_advisory_xact_lock(hashtextextended($1 || chr(31) || $2, 0));

-- name: insert_segments
-- One write per relay flush: every run's new segments, and the runs' frame counters
-- (counting only segments actually inserted, so a repeated flush counts nothing twice).
WITH ins AS (
    INSERT INTO frame_segments (run_id, first_seq, last_seq, last_stream_seq, frames)
    SELECT s.run_id, s.first_seq, s.last_seq, s.last_stream_seq, s.frames::jsonb
      FROM unnest($1::uuid[], $2::bigint[], $3::bigint[], $4::bigint[], $5::text[])
           AS s(run_id, first_seq, last_seq, last_stream_seq, frames)
     -- Segments never overlap, so that frame_count counts each frame once: a segment
     -- that overlaps one already written (a relay that lost its partition flushing
     -- frames the new owner repaired) is left out; what it alone held is repaired
     -- from the stream. Segments are disjoint, so the one starting last at or before
     -- this one's end is the only one that can overlap it.
     WHERE coalesce((SELECT f.last_seq FROM frame_segments f
                      WHERE f.run_id = s.run_id AND f.first_seq <= s.last_seq
                      ORDER BY f.first_seq DESC LIMIT 1), 0) < s.first_seq
    ON CONFLICT (run_id, first_seq) DO NOTHING
    RETURNING run_id, last_seq, jsonb_array_length(frames) AS n
), per_run AS (
    SELECT i.run_id, max(i.last_seq) AS last_seq, sum(i.n) AS n, bool_or(u.closed) AS closed
      FROM ins i
      JOIN unnest($1::uuid[], $3::bigint[], $6::boolean[]) AS u(run_id, last_seq, closed)
        ON u.run_id = i.run_id AND u.last_seq = i.last_seq
     GROUP BY i.run_id
)
-- A run's frames are closed once `done` was written and no frame is missing.
UPDATE runs r
   SET last_seq = GREATEST(r.last_seq, p.last_seq),
       frame_count = r.frame_count + p.n,
       frames_closed = r.frames_closed
           OR (p.closed AND r.frame_count + p.n >= GREATEST(r.last_seq, p.last_seq))
  FROM per_run p
 WHERE r.run_id = p.run_id
RETURNING r.run_id, r.tenant, r.last_seq, r.frame_count, p.closed AS done_written;

-- name: segments_after
-- `size`: the segment's frames as JSON text, in bytes (for the join's reply limit).
SELECT first_seq, last_seq, last_stream_seq, frames, octet_length(frames::text) AS size
  FROM frame_segments
 WHERE run_id = $1 AND last_seq > $2
 ORDER BY first_seq;

-- name: segment_ranges
-- What a run's segments cover, without their frames (for finding missing ones).
SELECT first_seq, last_seq, last_stream_seq FROM frame_segments
 WHERE run_id = $1 ORDER BY first_seq;

-- name: last_segment
SELECT last_seq, last_stream_seq FROM frame_segments
 WHERE run_id = $1 ORDER BY first_seq DESC LIMIT 1;

-- name: run_status_values
SELECT enumlabel FROM pg_enum e JOIN pg_type t ON t.oid = e.enumtypid
 WHERE t.typname = 'run_status' ORDER BY e.enumsortorder;

-- name: cancel_requested
-- The cheap poll between heartbeats: no row means the attempt was fenced out.
SELECT cancel_requested FROM runs
 WHERE run_id = $1 AND generation = $2 AND status = 'running';

-- name: events_timeline
-- Every recorded transition, oldest first (for audits and tests).
SELECT run_id, event, status, attempt, actor, code, at FROM run_events ORDER BY at, id;

-- name: lock_try
-- Session advisory locks (per database) on a dedicated connection: relay partitions
-- and relay presence. Released by unlock, or when the connection ends.
SELECT pg_try_advisory_lock($1::integer, $2::integer) AS locked;

-- name: lock_release
SELECT pg_advisory_unlock($1::integer, $2::integer) AS released;

-- name: lock_idle_timeout
-- Postgres ends this session (and so frees its locks) once it has been idle this long
-- (milliseconds): a relay that is frozen or cut off stops holding its partitions.
SELECT set_config('idle_session_timeout', $1, false) AS timeout;

-- name: lock_holders
-- How many sessions of this database hold a lock of one class (live relays).
SELECT count(DISTINCT pid) AS holders FROM pg_locks
 WHERE locktype = 'advisory' AND granted AND classid = $1::integer::oid
   AND database = (SELECT oid FROM pg_database WHERE datname = current_database());

-- name: purge_due
-- Ended runs whose frames are all in Postgres and whose stream grace is over.
UPDATE runs r
   SET stream_purged_at = now()
 WHERE r.run_id IN (
        SELECT run_id FROM runs
         WHERE ended_at IS NOT NULL AND frames_closed AND frame_count = last_seq
           AND stream_purged_at IS NULL
           AND ended_at < now() - make_interval(secs => $1)
         LIMIT $2
         FOR UPDATE SKIP LOCKED)
RETURNING r.run_id, r.tenant;

-- name: expire_frames
-- Ended runs past the frame retention: their segments go, their row (result) stays.
WITH due AS (
    SELECT run_id FROM runs
     WHERE ended_at IS NOT NULL AND frames_expired_at IS NULL AND frames_closed
       AND ended_at < now() - make_interval(secs => $1)
     LIMIT $2
     FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM frame_segments s USING due WHERE s.run_id = due.run_id
)
UPDATE runs r SET frames_expired_at = now()
  FROM due WHERE r.run_id = due.run_id
RETURNING r.run_id, r.tenant;

-- name: outbox_lock
-- One sweep of the outbox at a time (for this transaction): two publishing disjoint
-- batches at once could put a run's later event in the stream before an earlier one.
SELECT pg_try_advisory_xact_lock($1) AS locked;

-- name: outbox_of_xact
-- What a committed transaction implies that its service publishes at once: its jobs and
-- frames that were due when written (run events and later jobs are the sweep's).
SELECT id, kind, tenant, run_id, msg_id, body::text AS body, trace_parent
  FROM outbox
 WHERE xact = $1::text::xid8 AND kind <> 'event' AND due_at <= created_at
 ORDER BY id;

-- name: outbox_due
-- The sweep's rows, oldest first (the caller holds outbox_lock): run events, rows that
-- became due after they were written, and rows their service left (after $1 ms).
SELECT id, kind, tenant, run_id, msg_id, body::text AS body, trace_parent
  FROM outbox
 WHERE due_at <= now()
   AND (kind = 'event' OR due_at > created_at
        OR created_at < now() - make_interval(secs => $1 / 1000.0))
 ORDER BY id
 LIMIT $2
   FOR UPDATE SKIP LOCKED;

-- name: outbox_delete
-- Published: the rows are done.
DELETE FROM outbox WHERE id = ANY($1::bigint[]);

-- name: retrace_job
-- The span that decided a run's recovery becomes the parent of the attempt it queued.
UPDATE outbox SET trace_parent = $2 WHERE run_id = $1 AND kind = 'job';

-- name: outbox_pending
-- Rows waiting to be published, by kind (for tests and the queue gauges).
SELECT kind::text AS kind, count(*) AS n FROM outbox GROUP BY kind;

-- name: ping
SELECT 1 AS ok;

-- name: migration_lock
SELECT pg_advisory_lock($1);

-- name: migration_unlock
SELECT pg_advisory_unlock($1);

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

-- name: mark_frames_closed
-- A run whose missing frames can no longer be found: stop asking for its closing frames.
UPDATE runs SET frames_closed = true WHERE run_id = $1;
