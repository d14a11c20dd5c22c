-- Recovery's queries: expired leases, queue timeouts, session turns after a grace, lost
-- jobs, retention and the queue gauges.
-- Named queries: `-- name: <name>` starts one. Every transition is one guarded
-- statement that also appends its run_events row.

-- name: expire_leases
-- Running runs whose executor is gone: its lease ran out, or ($8: when presence locks
-- are believed) the presence lock its claim recorded ($7: the locks' class) is no longer
-- held because its process died. Recover them, or close them as interrupted after too
-- many recoveries without checkpoint progress.
WITH present AS MATERIALIZED (
    SELECT l.objid::bigint AS presence FROM pg_locks l
     WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
       AND l.classid = $7::integer::oid
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
), due AS (
    SELECT run_id, cancel_requested AS canceled,
           (checkpoint_version = recovery_checkpoint AND recoveries + 1 > $2) AS stalled,
           lease_expires_at >= now() AS gone
      FROM runs
     WHERE status = 'running'
       AND (lease_expires_at < now()
            OR ($8 AND lease_presence IS NOT NULL
                AND NOT EXISTS (SELECT 1 FROM present p WHERE p.presence = lease_presence)))
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
           lease_owner = NULL, lease_expires_at = NULL, lease_presence = NULL,
           close_seq = NULL, implied_trace_parent = NULL, job_published_at = now(),
           updated_at = now()
      FROM due
     WHERE r.run_id = due.run_id
    RETURNING r.*, due.gone
), ev AS (
    INSERT INTO run_events (run_id, event, status, attempt, actor, code, reason)
    SELECT run_id, status::text, status, attempts, $5, error->>'code',
           CASE WHEN gone THEN 'executor gone' ELSE 'lease expired' END
      FROM upd
)
SELECT *, pg_current_xact_id()::text AS xact FROM upd;

-- name: start_session_turns
-- Sessions whose next run may start although no run of theirs ended: a canceled run
-- still running past its grace no longer holds its session. Their runs get their job.
SELECT coalesce(sum(start_session_turn(s.tenant, s.session_id, $2)), 0)::integer AS started
  FROM (SELECT DISTINCT tenant, session_id FROM runs
         WHERE status = 'queued' AND job_published_at IS NULL AND session_id IS NOT NULL
           AND (session_id IS NULL OR NOT session_blocked(tenant, session_id, submit_seq))
         LIMIT $1) s;

-- name: start_share_turns
-- Tenants whose runs wait for their share although it has room (its last runs ended
-- while another was being submitted, or an operator raised the share): their runs get
-- their job.
SELECT coalesce(sum(start_share_turn(t.tenant, $2)), 0)::integer AS started
  FROM (SELECT DISTINCT tenant FROM runs
         WHERE status = 'queued' AND parent_run_id IS NULL AND job_published_at IS NULL
         LIMIT $1) t;

-- name: stale_jobs
-- Runs that have waited for an attempt longer than $1 ms since their job was issued or
-- last checked: the caller checks the stream for their job. Marked as checked.
UPDATE runs r
   SET job_checked_at = now()
 WHERE r.run_id IN (
        SELECT run_id FROM runs
         WHERE run_awaits_attempt(status) AND NOT cancel_requested
           AND job_published_at IS NOT NULL AND not_before <= now()
           AND greatest(job_published_at, job_checked_at)
               < now() - make_interval(secs => $1 / 1000.0)
         LIMIT $2
         FOR UPDATE SKIP LOCKED)
RETURNING r.run_id, r.runner;

-- name: reissue_jobs
-- Runs whose job is gone from the stream (deleted or purged): each gets a new job.
UPDATE runs
   SET job_published_at = now(), implied_trace_parent = NULL, updated_at = now()
 WHERE run_id = ANY($1::uuid[]) AND run_awaits_attempt(status)
   AND NOT cancel_requested AND job_published_at IS NOT NULL
RETURNING run_id, pg_current_xact_id()::text AS xact;

-- name: retrace_job
-- The span that decided a run's recovery becomes the parent of the attempt it queued.
UPDATE outbox SET trace_parent = $2 WHERE run_id = $1 AND kind = 'job';

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

-- name: expire_unserved
-- Runs waiting for a first attempt longer than $4 ms under a runner no executor serves
-- (not among $5, the runners with a consumer on the jobs stream) fail like a queue
-- timeout, with error $2: no executor would ever take their jobs.
WITH due AS (
    SELECT run_id FROM runs
     WHERE status = 'queued' AND attempts = 0 AND job_published_at IS NOT NULL
       AND runner <> ALL($5::text[])
       AND created_at + make_interval(secs => $4 / 1000.0) <= now()
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
    SELECT run_id, 'failed', status, attempts, $3, 'QUEUE_TIMEOUT', 'no executor serves its runner'
      FROM upd
)
SELECT *, pg_current_xact_id()::text AS xact FROM upd;

-- name: settled_runs
-- Which of these runs need no job any more: ended, or not there at all.
SELECT k.run_id FROM unnest($1::uuid[]) AS k(run_id)
 WHERE NOT EXISTS (SELECT 1 FROM runs r
                    WHERE r.run_id = k.run_id AND NOT run_terminal(r.status));

-- name: queue_stats
-- Per tenant with runs queued, recovering or running: runs waiting for an attempt and the
-- age of the oldest (since its submit); those of them without a job yet (delayed, or behind
-- their session, key or share); the runs holding a job and the tenant's share. (An age
-- is never below 0: a run submitted in the instant between this transaction's start,
-- which is now(), and its snapshot would be younger than now.)
SELECT a.tenant, a.depth, a.oldest_age_s, a.held, tenant_issued(a.tenant) AS issued,
       (SELECT o_share FROM tenant_share(a.tenant)) AS share
  FROM (SELECT tenant, count(*) FILTER (WHERE status <> 'running') AS depth,
               greatest(0, extract(epoch FROM
                   now() - min(created_at) FILTER (WHERE status <> 'running')))::float8
                   AS oldest_age_s,
               count(*) FILTER (WHERE status = 'queued' AND job_published_at IS NULL
                                  AND parent_run_id IS NULL) AS held
          FROM runs
         WHERE status IN ('queued', 'recovering', 'running')
         GROUP BY tenant) a;

-- name: waiting_stats
-- Per tenant: runs waiting for an answer (status 'waiting'), and how long the oldest has
-- waited. It reads every waiting run: measured every waiting_gauges_interval_ms, not at
-- each tick.
SELECT tenant, count(*) AS waiting,
       greatest(0, extract(epoch FROM now() - min(updated_at)))::float8 AS oldest_wait_s
  FROM runs
 WHERE status = 'waiting'
 GROUP BY tenant;

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

-- name: close_orphaned_reservations
-- Reservations whose attempt is gone (the run moved to a newer generation) or whose run
-- ended: nobody will settle them. Whether their call happened is not known (a crash
-- between the call and its settlement), so each is charged what it reserved. An
-- effect's reservation (`effect:<key>`) follows its effect instead, across attempts:
-- released here only when its run ended with the effect never claimed (so never
-- dispatched); a claimed or unknown effect keeps it until a reconcile or an operator
-- settles the effect.
WITH upd AS (
    UPDATE budget_reservations b
       SET state = CASE WHEN b.key LIKE 'effect:%' THEN 'released' ELSE 'settled' END,
           used = CASE WHEN b.key LIKE 'effect:%' THEN b.used ELSE b.tokens END,
           cost_used = CASE WHEN b.key LIKE 'effect:%' THEN b.cost_used ELSE b.cost END,
           receipt = CASE WHEN b.key LIKE 'effect:%' THEN b.receipt
                          ELSE 'unsettled: charged as reserved' END,
           settled_at = now()
      FROM runs r
     WHERE b.state = 'reserved' AND r.run_id = b.run_id
       AND CASE WHEN b.key LIKE 'effect:%'
                THEN run_terminal(r.status) AND EXISTS (
                         SELECT 1 FROM effects e
                          WHERE e.run_id = b.run_id AND 'effect:' || e.key = b.key
                            AND e.state = 'prepared')
                ELSE r.generation > b.generation OR run_terminal(r.status) END
    RETURNING b.run_id, b.key, b.tokens, b.state, r.status, r.attempts
), ev AS (
    INSERT INTO run_events (run_id, event, status, attempt, actor, reason)
    SELECT run_id,
           CASE WHEN state = 'settled' THEN 'budget_settled' ELSE 'budget_released' END,
           status, attempts, 'recovery',
           key || ': ' || tokens || CASE WHEN state = 'settled'
               THEN ' tokens charged: no attempt settled it, and its call may have happened'
               ELSE ' tokens released: its effect was never dispatched' END
      FROM upd
)
SELECT run_id FROM upd;

-- name: workflow_sweep
-- Node runs past their deadline time out (and their on_failure applies); runs of node
-- runs whose workflow run ended are stopped. What that implies waits in the outbox under
-- `xact`.
SELECT timed_out, stopped, pg_current_xact_id_if_assigned()::text AS xact
  FROM workflow_sweep($1);

-- name: webhooks_due
-- Up to $1 deliveries that are due, oldest first, each leased for $2 ms (another replica
-- leaves it alone until then), with their tenant's signing secret.
WITH due AS (
    SELECT id FROM webhook_deliveries
     WHERE state = 'pending' AND next_at <= now()
     ORDER BY next_at
     LIMIT $1
       FOR UPDATE SKIP LOCKED
), leased AS (
    UPDATE webhook_deliveries d SET next_at = now() + make_interval(secs => $2 / 1000.0)
      FROM due WHERE d.id = due.id
    RETURNING d.*
)
SELECT l.id, l.tenant, l.url, l.msg_id, l.body::text AS body, l.attempts, s.secret
  FROM leased l LEFT JOIN webhook_secrets s ON s.tenant = l.tenant;

-- name: webhook_delivered
UPDATE webhook_deliveries
   SET state = 'delivered', attempts = attempts + 1, last_error = NULL, ended_at = now()
 WHERE id = $1 AND state = 'pending';

-- name: webhook_not_delivered
-- An attempt that failed with error $2: tried again after $4 ms when $3, else failed.
UPDATE webhook_deliveries
   SET attempts = attempts + 1, last_error = $2,
       state = CASE WHEN $3 THEN 'pending' ELSE 'failed' END,
       next_at = now() + make_interval(secs => $4 / 1000.0),
       ended_at = CASE WHEN $3 THEN NULL ELSE now() END
 WHERE id = $1 AND state = 'pending';

-- name: forget_webhooks
-- Deliveries made more than $1 seconds ago, and failed ones older than $2 seconds.
DELETE FROM webhook_deliveries
 WHERE id IN (SELECT id FROM webhook_deliveries
               WHERE (state = 'delivered' AND ended_at < now() - make_interval(secs => $1))
                  OR (state = 'failed' AND ended_at < now() - make_interval(secs => $2))
               LIMIT 1000);

-- name: due_schedules
-- Up to $1 schedules whose next fire is due, locked (another replica skips them) until
-- the transaction that fires them ends.
SELECT tenant, name, cron, tz, catch_up_s, next_fire_at FROM schedules
 WHERE NOT paused AND next_fire_at <= now()
 ORDER BY next_fire_at
 LIMIT $1
   FOR UPDATE SKIP LOCKED;

-- name: fire_schedule
SELECT fire_schedule($1, $2, $3::timestamptz[], $4, $5, $6) AS made;
