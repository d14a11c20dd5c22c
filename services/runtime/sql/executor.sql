-- The executor's queries: claim a run, keep its lease, close its attempt. Every write
-- is fenced by the attempt's generation.
-- Named queries: `-- name: <name>` starts one. Every transition is one guarded
-- statement that also appends its run_events row.

-- name: claim_run
-- Starts an attempt: a new generation fences every write of earlier attempts. A run never
-- starts while an earlier run of its session holds the session. $6: the key of the
-- executor's presence lock (NULL when it holds none: then only the lease tells). The
-- close point of the attempt before (`close_seq`) is kept as `prev_close_seq`.
WITH upd AS (
    UPDATE runs
       SET status = 'running', attempts = attempts + 1, generation = generation + 1,
           lease_owner = $3, lease_expires_at = now() + make_interval(secs => $4 / 1000.0),
           job_ack = $5, lease_presence = $6, prev_close_seq = close_seq, close_seq = NULL,
           limit_key = NULL, started_at = coalesce(started_at, now()), updated_at = now()
     WHERE run_id = $1 AND generation = $2 AND run_awaits_attempt(status)
       AND NOT cancel_requested AND not_before <= now()
       AND (attempts > 0 OR queue_timeout_ms IS NULL
            OR created_at + make_interval(secs => queue_timeout_ms / 1000.0) > now())
       AND (session_id IS NULL OR NOT session_blocked(tenant, session_id, submit_seq))
    RETURNING *
), ev AS (
    INSERT INTO run_events (run_id, event, status, attempt, actor, reason)
    SELECT run_id, 'claimed', status, attempts, $3, 'attempt started' FROM upd
)
-- A node run's claim implies its `node` frame: the executor publishes it (`xact`).
SELECT *, pg_current_xact_id()::text AS xact FROM upd;

-- name: claim_runs
-- claim_run for many jobs at once, in one statement (see migration 0019): the runs it
-- claimed, each with the transaction's id.
SELECT *, pg_current_xact_id()::text AS xact
  FROM claim_runs($1::uuid[], $2::integer[], $3, $4, $5::text[], $6);

-- name: heartbeat_many
-- Renews the leases of the attempts still holding them ($1 run ids, $2 generations, $3
-- lease lengths, $4 texts so far): what each gets back is whether a cancel was requested
-- (no row: the attempt was fenced out). The rows are locked in run id order, the order
-- every statement that writes several runs takes, so that two never deadlock.
WITH held AS (
    SELECT r.run_id
      FROM runs r
      JOIN unnest($1::uuid[], $2::integer[]) AS a(run_id, generation)
        ON r.run_id = a.run_id AND r.generation = a.generation
     WHERE r.status = 'running'
     ORDER BY r.run_id
       FOR NO KEY UPDATE OF r
)
UPDATE runs r
   SET lease_expires_at = now() + make_interval(secs => a.lease_ms / 1000.0),
       partial_text = a.partial_text, updated_at = now()
  FROM unnest($1::uuid[], $2::integer[], $3::integer[], $4::text[])
       AS a(run_id, generation, lease_ms, partial_text)
 WHERE r.run_id = a.run_id AND r.generation = a.generation AND r.status = 'running'
   AND r.run_id IN (SELECT run_id FROM held)
RETURNING r.run_id, r.generation, r.cancel_requested;

-- name: cancel_requested_many
-- The cheap poll between heartbeats, for many attempts at once: no row for an attempt
-- means it was fenced out.
SELECT r.run_id, r.generation, r.cancel_requested
  FROM runs r
  JOIN unnest($1::uuid[], $2::integer[]) AS a(run_id, generation)
    ON r.run_id = a.run_id AND r.generation = a.generation
 WHERE r.status = 'running';

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

-- name: finish_runs_told
-- finish_run for many attempts at once, in one statement (finish_runs, migration 0020),
-- and what the transaction implies that is due at once (each run's `done`, the job of
-- the next run of a session): the runs' rows, then one row without a run whose
-- `messages` are those (see finish_runs_told in migration 0024).
SELECT (x.o_run).*, x.o_messages AS messages, pg_current_xact_id()::text AS xact
  FROM finish_runs_told($1::uuid[], $2::integer[], $3::text[], $4::text[], $5,
                        $6::integer[], $7::text[]) x;

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

-- name: hand_back_run
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

-- name: rate_wait_run
-- The attempt's model call waits for room under rate limit $4: the run goes back to the
-- queue, the attempt not counted, its job due at $3 (or sooner, when room comes: see
-- rate_serve_waiters; at once when room came while the attempt was ending); or, when a
-- cancel arrived meanwhile, the run is closed as canceled. As after a shutdown's hand
-- back, the next attempt has the same number: it resumes from what the relay stored.
WITH upd AS (
    UPDATE runs
       SET status = CASE WHEN cancel_requested THEN 'canceled'::run_status
                         ELSE 'queued'::run_status END,
           error = CASE WHEN cancel_requested THEN coalesce(cancel_error, $7) ELSE error END,
           ended_at = CASE WHEN cancel_requested THEN now() END,
           attempts = attempts - 1, partial_text = $5,
           not_before = CASE WHEN rate_granted_run(run_id) THEN now()
                             ELSE greatest($3, now()) END,
           limit_key = $4,
           lease_owner = NULL, lease_expires_at = NULL,
           close_seq = CASE WHEN cancel_requested THEN $8::integer END,
           implied_trace_parent = $9, job_published_at = now(), updated_at = now()
     WHERE run_id = $1 AND generation = $2 AND status = 'running'
    RETURNING *
), ev AS (
    INSERT INTO run_events (run_id, event, status, attempt, actor, code, reason)
    SELECT run_id, CASE WHEN status = 'canceled' THEN 'canceled' ELSE 'rate_limited' END,
           status, attempts, $6, error->>'code',
           CASE WHEN status = 'canceled' THEN error->>'message'
                ELSE 'waits for room under rate limit ' || $4 || ' until '
                     || rfc3339(not_before) END
      FROM upd
)
SELECT *, pg_current_xact_id()::text AS xact FROM upd;

-- name: rate_reserve
SELECT *, pg_current_xact_id()::text AS xact FROM rate_reserve($1::text[], $2, $3, $4, $5);

-- name: rate_settle
SELECT rate_settle($1, $2, $3, $4) AS served, pg_current_xact_id()::text AS xact;

-- name: rate_observe
SELECT rate_observe($1::text[], $2::jsonb);

-- name: register_runner
-- An executor serves runner $1 (input schema $2, NULL for any object); the latest wins.
INSERT INTO runners (name, input_schema, registered_by)
VALUES ($1, $2, $3)
ON CONFLICT (name) DO UPDATE
   SET input_schema = EXCLUDED.input_schema, registered_by = EXCLUDED.registered_by,
       registered_at = now();

-- name: pin_config
-- The first attempt of a run submitted without a pinned configuration pins its own.
UPDATE runs SET config_pin = $3
 WHERE run_id = $1 AND generation = $2 AND config_pin IS NULL
RETURNING config_pin;

-- name: effect_prepare
-- Persist a side effect's command before anything leaves the process (only while the
-- attempt of generation $7 holds the run); an effect already prepared under this key
-- is returned as it is. $8, $9: the tokens and cost units it reserved (`effect:<key>`,
-- in the same transaction).
WITH ins AS (
    INSERT INTO effects (run_id, key, kind, idempotency_key, request, request_digest,
                         tokens, cost, auth_fence)
    SELECT r.run_id, $2, $3, $4, $5, $6, $8, $9, r.auth_fence
      FROM runs r
     WHERE r.run_id = $1 AND r.generation = $7 AND r.status = 'running'
    ON CONFLICT (run_id, key) DO NOTHING
    RETURNING *
)
SELECT *, false AS past_deadline FROM ins
UNION ALL
SELECT *, deadline_at < now() AS past_deadline
  FROM effects WHERE run_id = $1 AND key = $2 AND NOT EXISTS (SELECT 1 FROM ins);

-- name: effect_get
SELECT *, deadline_at < now() AS past_deadline FROM effects WHERE run_id = $1 AND key = $2;

-- name: effect_claim
-- Take the effect for a dispatch: a new fence token, fenced by the run's generation, the
-- effect's version and its authorization (the digest of the run's permissions and its
-- tenant's policy it was prepared under must still match, and both must permit the
-- effect's kind $6); the claim holds for $5 ms. An effect whose authorization is stale,
-- or whose kind is not permitted, comes back unchanged with `fresh` or `permitted` false
-- (`tenant_permits` false: its tenant's policy is what refuses the kind). A tenant
-- without a policy may perform no kind: an operator allows kinds first (a policy whose
-- `effects` is NULL allows every kind).
WITH run AS (
    SELECT r.run_id,
           e.auth_fence IS NOT DISTINCT FROM run_authorization(r.tenant, r.effects) AS fresh,
           (r.effects IS NULL OR $6 = ANY (r.effects)) AS run_permits,
           p.tenant IS NOT NULL AND (p.effects IS NULL OR $6 = ANY (p.effects))
               AS tenant_permits
      FROM runs r
      JOIN effects e ON e.run_id = r.run_id AND e.key = $2
      LEFT JOIN tenant_policies p ON p.tenant = r.tenant
     WHERE r.run_id = $1 AND r.generation = $4 AND r.status = 'running'
), claimed AS (
    UPDATE effects e
       SET state = 'claimed', fence = e.fence + 1, version = e.version + 1,
           claimed_generation = $4, deadline_at = now() + make_interval(secs => $5 / 1000.0),
           updated_at = now()
      FROM run
     WHERE e.run_id = $1 AND e.key = $2 AND e.version = $3
       AND e.state IN ('prepared', 'claimed', 'unknown')
       AND run.run_id = e.run_id AND run.fresh AND run.run_permits AND run.tenant_permits
    RETURNING e.*
)
SELECT *, false AS past_deadline, true AS fresh, true AS permitted, true AS tenant_permits
  FROM claimed
UNION ALL
SELECT e.*, e.deadline_at < now() AS past_deadline, run.fresh,
       run.run_permits AND run.tenant_permits, run.tenant_permits
  FROM effects e
  JOIN run ON run.run_id = e.run_id
          AND NOT (run.fresh AND run.run_permits AND run.tenant_permits)
 WHERE e.run_id = $1 AND e.key = $2;

-- name: effect_settle
-- Record how a dispatch (or a reconcile) ended, if nobody moved the effect meanwhile.
-- The effect's reservation follows it (trigger effect_budget_close).
UPDATE effects
   SET state = $4, receipt = $5, error = $6, error_code = $7, version = version + 1,
       updated_at = now()
 WHERE run_id = $1 AND key = $2 AND version = $3
RETURNING *, deadline_at < now() AS past_deadline;

-- name: budget_reserve
SELECT * FROM budget_reserve($1, $2, $3, $4, $5);

-- name: budget_settle
-- Settle a reservation with what the call used; once (a second settle changes nothing).
WITH upd AS (
    UPDATE budget_reservations
       SET state = 'settled', used = $3, receipt = $4, cost_used = $5, settled_at = now()
     WHERE run_id = $1 AND key = $2 AND state = 'reserved'
    RETURNING run_id, key, tokens, used, cost, cost_used
), ev AS (
    INSERT INTO run_events (run_id, event, status, attempt, actor, reason)
    SELECT r.run_id, 'budget_settled', r.status, r.attempts, coalesce(r.lease_owner, 'executor'),
           u.key || ': ' || u.used || ' of ' || u.tokens || ' tokens used'
               || CASE WHEN u.cost > 0 OR u.cost_used > 0
                       THEN ', ' || u.cost_used || ' of ' || u.cost || ' cost units'
                       ELSE '' END
      FROM upd u JOIN runs r ON r.run_id = u.run_id
)
SELECT used FROM upd;

-- name: ended_effects
-- Effects that runs which ended left open, of the kinds $1 this executor can reconcile:
-- `unknown`, or `claimed` past their claim's deadline (a dispatch may still be on its way
-- before it). The $2 checked longest ago, none checked in the last $3 ms; marked checked,
-- so that executors share them.
UPDATE effects e
   SET checked_at = now()
 WHERE (e.run_id, e.key) IN (
        SELECT o.run_id, o.key
          FROM effects o JOIN runs r ON r.run_id = o.run_id
         WHERE (o.state = 'unknown' OR (o.state = 'claimed' AND o.deadline_at < now()))
           AND run_terminal(r.status) AND o.kind = ANY($1::text[])
           AND (o.checked_at IS NULL
                OR o.checked_at < now() - make_interval(secs => $3 / 1000.0))
         ORDER BY o.checked_at NULLS FIRST
         LIMIT $2
           FOR UPDATE OF o SKIP LOCKED)
RETURNING e.*, e.deadline_at < now() AS past_deadline;

-- name: settle_ended_effect
-- Record what a reconcile found of an effect of a run that ended, if nobody moved the
-- effect meanwhile; a run event by $8. Its reservation follows (effect_budget_close).
WITH upd AS (
    UPDATE effects e
       SET state = $4::effect_state, receipt = $5, error = $6, error_code = $7,
           version = e.version + 1, updated_at = now()
      FROM runs r
     WHERE e.run_id = $1 AND e.key = $2 AND e.version = $3
       AND r.run_id = e.run_id AND run_terminal(r.status)
    RETURNING e.run_id, e.key, e.state::text AS state, r.status, r.attempts
), ev AS (
    INSERT INTO run_events (run_id, event, status, attempt, actor, reason)
    SELECT run_id, 'effect_resolved', status, attempts, $8,
           key || ': ' || state || ' (reconciled after its run ended)'
      FROM upd
)
SELECT state FROM upd;
