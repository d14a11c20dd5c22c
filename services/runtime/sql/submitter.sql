-- The submitter's queries: accept a run, cancel runs, fail a run the queue refused.
-- Named queries: `-- name: <name>` starts one. Every transition is one guarded
-- statement that also appends its run_events row.

-- name: insert_run
WITH quota AS (
    -- Raises (RWQ01) when a quota of the tenant refuses the run: nothing is written.
    SELECT submit_quota_check($2) AS ok
), ins AS (
    -- A run whose session is busy, or whose tenant holds its share of jobs, gets no job
    -- yet (job_published_at NULL): it gets one when its turn comes (start_session_turn,
    -- start_share_turn). clock_timestamp(), not now() (the transaction's
    -- start, before a wait for the session's lock): runs of a session are created in
    -- the order they were accepted.
    INSERT INTO runs (run_id, tenant, request_id, session_id, multitask, runner, input,
                      metadata, max_attempts, attempt_timeout_ms, queue_timeout_ms,
                      job_published_at, created_at, updated_at, trace_parent, config_pin,
                      budget_tokens, budget_cost, effects, auth_fence, workflow, priority,
                      concurrency_key, not_before)
    SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11,
           CASE WHEN submit_admits($2, $4, $20, coalesce($21, now())) THEN now() END,
           clock_timestamp(), clock_timestamp(), $13, $14, $15, $16, $17,
           run_authorization($2, $17), $18, coalesce($19, 0), $20, coalesce($21, now())
      FROM quota WHERE quota.ok
    ON CONFLICT (tenant, request_id) DO NOTHING
    RETURNING *
), ev AS (
    INSERT INTO run_events (run_id, event, status, attempt, actor, reason, at)
    SELECT run_id, 'submitted', status, attempts, $12, submitted_reason(ROW(ins.*)::runs),
           created_at
      FROM ins
)
SELECT *, pg_current_xact_id()::text AS xact FROM ins;

-- name: submit_runs
-- insert_run for the runs submitted at the same moment outside a session, in one
-- statement (insert_runs, migration 0021), and what the transaction implies that is due
-- at once (their jobs): the runs' rows, then one row without a run whose `messages` are
-- those (see submit_runs in migration 0024).
SELECT (x.o_run).*, x.o_messages AS messages, pg_current_xact_id()::text AS xact
  FROM submit_runs($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
                   $7::text[], $8::integer[], $9::integer[], $10::integer[], $11::text,
                   $12::text[], $13::text[], $14::bigint[], $15::bigint[], $16::text[],
                   $17::text[], $18::integer[], $19::text[], $20::timestamptz[]) x;

-- name: run_by_request
-- The run a request id made, or whose input it joined (multitask `coalesce`).
(SELECT * FROM runs WHERE tenant = $1 AND request_id = $2)
UNION ALL
(SELECT r.* FROM coalesced_requests c JOIN runs r ON r.run_id = c.run_id
  WHERE c.tenant = $1 AND c.request_id = $2)
LIMIT 1;

-- name: coalesce_into
-- The session's last run, when it waits without a job, was never attempted and was
-- submitted with multitask `coalesce` for runner $3, takes input $4 (added to its
-- `inputs`) for request id $5, unless its input would pass $6 bytes: that run, or none.
WITH target AS (
    SELECT r.run_id FROM runs r
     WHERE r.tenant = $1 AND r.session_id = $2 AND r.status = 'queued'
       AND r.job_published_at IS NULL AND r.attempts = 0 AND r.multitask = 'coalesce'
       AND r.runner = $3 AND NOT r.cancel_requested
       AND NOT EXISTS (SELECT 1 FROM runs l WHERE l.tenant = $1 AND l.session_id = $2
                                           AND l.submit_seq > r.submit_seq)
       FOR UPDATE
), upd AS (
    UPDATE runs r
       SET input = jsonb_set(r.input, '{inputs}', (r.input -> 'inputs') || jsonb_build_array($4::jsonb)),
           updated_at = now()
      FROM target
     WHERE r.run_id = target.run_id AND r.job_published_at IS NULL
       AND octet_length(r.input::text) + octet_length($4::text) <= $6
    RETURNING r.*
), req AS (
    INSERT INTO coalesced_requests (tenant, request_id, run_id)
    SELECT $1, $5, run_id FROM upd
)
SELECT *, pg_current_xact_id()::text AS xact FROM upd;

-- name: session_active
SELECT run_id FROM runs
 WHERE tenant = $1 AND session_id = $2 AND run_active(status)
 ORDER BY submit_seq;

-- name: lock_session
-- Serializes the submits (and aborts) of one session until the transaction ends. The
-- one-bigint key form never meets the two-integer keys of the relay's locks.
SELECT pg_advisory_xact_lock(hashtextextended($1 || chr(31) || $2, 0));

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
     WHERE tenant = $1 AND run_id = $2 AND run_active(status)
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
     WHERE tenant = $1 AND session_id = $2 AND run_active(status)
    RETURNING *
), ev AS (
    INSERT INTO run_events (run_id, event, status, attempt, actor, code, reason)
    SELECT run_id, 'cancel_requested', status, attempts, $5, cancel_error->>'code',
           cancel_error->>'message'
      FROM upd
)
SELECT *, pg_current_xact_id()::text AS xact FROM upd ORDER BY submit_seq;

-- name: forget_tenant
-- What forget_tenant deleted of a removed tenant: (active, runs, releases).
SELECT o_active AS active, o_runs AS runs, o_releases AS releases FROM forget_tenant($1);

-- name: cancel_tenant
-- request_cancel for every queued, running or recovering run of a tenant at once (an
-- operator's end_tenant, once the tenant's identity is revoked), oldest first.
WITH upd AS (
    UPDATE runs
       SET cancel_requested = true,
           cancel_error = coalesce(cancel_error, $2),
           cancel_deadline = coalesce(cancel_deadline, now() + make_interval(secs => $3 / 1000.0)),
           status = CASE WHEN status = 'running' THEN status ELSE 'canceled'::run_status END,
           error = CASE WHEN status = 'running' THEN error ELSE coalesce(cancel_error, $2) END,
           ended_at = CASE WHEN status = 'running' THEN ended_at ELSE now() END,
           close_seq = NULL, updated_at = now()
     WHERE tenant = $1 AND run_active(status)
    RETURNING *
), ev AS (
    INSERT INTO run_events (run_id, event, status, attempt, actor, code, reason)
    SELECT run_id, 'cancel_requested', status, attempts, $4, cancel_error->>'code',
           cancel_error->>'message'
      FROM upd
)
SELECT *, pg_current_xact_id()::text AS xact FROM upd ORDER BY submit_seq;

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

-- name: runner_catalog
-- Every runner some executor has served, with the JSON Schema of its input.
SELECT name, input_schema FROM runners ORDER BY name;

-- name: run_effects
-- A run's side effects, in the order they were prepared.
SELECT key, kind, state::text AS state, receipt, error
  FROM effects WHERE run_id = $1 ORDER BY created_at, key;

-- name: run_budget
-- A run's budget (NULL: none of its own) and what its costly calls used (settled) and
-- hold (reserved now).
SELECT r.budget_tokens, r.budget_cost,
       coalesce(sum(b.used) FILTER (WHERE b.state = 'settled'), 0) AS tokens_used,
       coalesce(sum(b.tokens) FILTER (WHERE b.state = 'reserved'), 0) AS tokens_reserved,
       coalesce(sum(b.cost_used) FILTER (WHERE b.state = 'settled'), 0) AS cost_used,
       coalesce(sum(b.cost) FILTER (WHERE b.state = 'reserved'), 0) AS cost_reserved,
       count(b.key) AS calls
  FROM runs r LEFT JOIN budget_reservations b ON b.run_id = r.run_id
 WHERE r.run_id = $1
 GROUP BY r.run_id;

-- name: resolve_effect
-- An operator settles an effect whose outcome is not known: `reconciled` with a receipt,
-- or `failed`. Only an `unknown` or `claimed` effect of the tenant's run moves, or one
-- failed by its deadline (it may have happened: the operator says whether it did); the
-- move is a run event ($6: who resolved it). The effect's reservation follows it
-- (trigger effect_budget_close): charged when it happened, released when it did not.
WITH upd AS (
    UPDATE effects e
       SET state = CASE WHEN $4::jsonb IS NOT NULL THEN 'reconciled'
                        ELSE 'failed' END::effect_state,
           receipt = $4, error = $5,
           error_code = CASE WHEN $4::jsonb IS NOT NULL THEN NULL ELSE 'EFFECT_FAILED' END,
           version = e.version + 1, updated_at = now()
      FROM runs r
     WHERE e.run_id = $2 AND e.key = $3 AND r.run_id = e.run_id AND r.tenant = $1
       AND (e.state IN ('unknown', 'claimed')
            OR (e.state = 'failed' AND e.error_code = 'EFFECT_DEADLINE_EXCEEDED'))
    RETURNING e.run_id, e.key, e.state::text AS state, r.status, r.attempts
), ev AS (
    INSERT INTO run_events (run_id, event, status, attempt, actor, reason)
    SELECT run_id, 'effect_resolved', status, attempts, $6, key || ': ' || state
      FROM upd
)
SELECT state FROM upd;

-- name: reschedule_run
-- A run that waits without a job (delayed, or behind its session, key or share) starts
-- no earlier than $3 from now on; nothing for a run with its job, or not queued.
WITH upd AS (
    UPDATE runs SET not_before = $3, updated_at = now()
     WHERE tenant = $1 AND run_id = $2 AND status = 'queued' AND job_published_at IS NULL
    RETURNING *
), ev AS (
    INSERT INTO run_events (run_id, event, status, attempt, actor, reason)
    SELECT run_id, 'rescheduled', status, attempts, $4,
           'to start no earlier than ' || rfc3339(not_before)
      FROM upd
)
SELECT * FROM upd;

-- name: start_share_turn
-- The tenant's waiting runs that may start now get their job (see start_share_turn).
SELECT start_share_turn($1, $2) AS started, pg_current_xact_id()::text AS xact;

-- name: set_webhook_endpoints
SELECT set_webhook_endpoints($1, $2::text[], $3::text[]);

-- name: put_webhook_secret
-- The tenant's signing secret $2 when it has none, or when $3 (rotate): returned only then.
INSERT INTO webhook_secrets AS w (tenant, secret) VALUES ($1, $2)
ON CONFLICT (tenant) DO UPDATE SET secret = EXCLUDED.secret, created_at = now() WHERE $3
RETURNING w.secret;

-- name: webhooks_of
-- A tenant's endpoints, its deliveries not made yet, and the latest that failed for good.
SELECT (SELECT coalesce(jsonb_agg(jsonb_build_object('url', url, 'events', events)
                                  ORDER BY created_at, url), '[]')
          FROM webhook_endpoints WHERE tenant = $1) AS endpoints,
       (SELECT count(*) FROM webhook_deliveries WHERE tenant = $1 AND state = 'pending')
           AS pending,
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'msg_id', f.msg_id, 'url', f.url, 'event', f.event,
                   'attempts', f.attempts, 'error', f.last_error, 'at', rfc3339(f.ended_at))
                   ORDER BY f.ended_at DESC), '[]')
          FROM (SELECT * FROM webhook_deliveries WHERE tenant = $1 AND state = 'failed'
                ORDER BY ended_at DESC LIMIT $2) f) AS failed;

-- name: queued_for
SELECT run_queued_for(r) AS queued_for FROM runs r WHERE run_id = $1;

-- name: set_queue_defaults
-- The share and queue capacity of a tenant without its own (the submitter's settings).
INSERT INTO queue_defaults AS d (share_runs, max_queued_runs, priority_max_wait_ms)
VALUES ($1, $2, $3)
ON CONFLICT (only_row) DO UPDATE
   SET share_runs = EXCLUDED.share_runs, max_queued_runs = EXCLUDED.max_queued_runs,
       priority_max_wait_ms = EXCLUDED.priority_max_wait_ms, updated_at = now()
 WHERE (d.share_runs, d.max_queued_runs, d.priority_max_wait_ms)
       IS DISTINCT FROM (EXCLUDED.share_runs, EXCLUDED.max_queued_runs,
                         EXCLUDED.priority_max_wait_ms);

-- name: set_tenant_budget
-- $2..$8: the new limits; $9: which of them were given (tokens, active, per day, cost,
-- share, queue capacity, runs per concurrency key).
INSERT INTO tenant_budgets (tenant, tokens, max_active_runs, max_runs_per_day, cost, share,
                            max_queued_runs, max_runs_per_key)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (tenant) DO UPDATE
   SET tokens = CASE WHEN ($9::boolean[])[1] THEN EXCLUDED.tokens ELSE tenant_budgets.tokens END,
       max_active_runs = CASE WHEN ($9::boolean[])[2] THEN EXCLUDED.max_active_runs
                              ELSE tenant_budgets.max_active_runs END,
       max_runs_per_day = CASE WHEN ($9::boolean[])[3] THEN EXCLUDED.max_runs_per_day
                               ELSE tenant_budgets.max_runs_per_day END,
       cost = CASE WHEN ($9::boolean[])[4] THEN EXCLUDED.cost ELSE tenant_budgets.cost END,
       share = CASE WHEN ($9::boolean[])[5] THEN EXCLUDED.share ELSE tenant_budgets.share END,
       max_queued_runs = CASE WHEN ($9::boolean[])[6] THEN EXCLUDED.max_queued_runs
                              ELSE tenant_budgets.max_queued_runs END,
       max_runs_per_key = CASE WHEN ($9::boolean[])[7] THEN EXCLUDED.max_runs_per_key
                               ELSE tenant_budgets.max_runs_per_key END,
       updated_at = now()
RETURNING tokens;

-- name: tenant_budget
-- A tenant's limits (NULL: none, also without a row), what it spent (settled and still
-- reserved, tokens and cost units), its active runs and the runs it submitted today (UTC);
-- its share of jobs (in runs, its weight applied) and queue capacity, and how many of its
-- runs hold a job and wait for an attempt now (and for room under a rate limit).
SELECT b.tokens, b.max_active_runs, b.max_runs_per_day, b.cost, b.share, b.max_runs_per_key,
       sh.o_share AS share_runs, sh.o_max_queued AS max_queued_runs,
       tenant_issued($1) AS issued_runs,
       (SELECT count(*) FROM runs WHERE tenant = $1 AND status = 'queued'
           AND parent_run_id IS NULL) AS queued_runs,
       (SELECT count(*) FROM runs WHERE tenant = $1 AND status = 'queued'
           AND limit_key IS NOT NULL AND not_before > now()) AS rate_limited_runs,
       (SELECT count(*) FROM runs WHERE tenant = $1 AND run_active(status)) AS active_runs,
       (SELECT count(*) FROM runs WHERE tenant = $1
           AND created_at >= date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC')
           AS runs_today,
       coalesce(s.tokens, 0)::bigint AS spent,
       coalesce(s.cost, 0)::bigint AS cost_spent,
       coalesce(o.tokens, 0)::bigint AS reserved,
       coalesce(o.cost, 0)::bigint AS cost_reserved
  FROM (SELECT $1::text AS tenant) t
  CROSS JOIN tenant_share($1) sh
  LEFT JOIN tenant_budgets b ON b.tenant = t.tenant
  LEFT JOIN tenant_spend s ON s.tenant = t.tenant
  LEFT JOIN LATERAL (SELECT sum(tokens) AS tokens, sum(cost) AS cost FROM budget_reservations
                      WHERE tenant = t.tenant AND state = 'reserved') o ON true;

-- name: set_tenant_policy
-- Replace the tenant's policy (the effect kinds its runs may perform; NULL: every kind;
-- a tenant without a row may perform none).
-- Its version grows: every run submitted before holds a stale authorization now.
INSERT INTO tenant_policies AS p (tenant, effects) VALUES ($1, $2)
ON CONFLICT (tenant) DO UPDATE
   SET effects = EXCLUDED.effects, version = p.version + 1, updated_at = now()
RETURNING effects, version;

-- name: tenant_policy
-- The effect kinds the tenant's runs may perform and the policy's version. No policy was
-- ever set (version 0): no kind, an empty list (NULL is every kind, set explicitly).
SELECT CASE WHEN p.tenant IS NULL THEN '{}'::text[] ELSE p.effects END AS effects,
       coalesce(p.version, 0) AS version
  FROM (SELECT $1::text AS tenant) t LEFT JOIN tenant_policies p ON p.tenant = t.tenant;

-- name: insert_release
-- A release, once: the stored one when its id and version exist (compare its digest).
WITH ins AS (
    INSERT INTO releases (tenant, release_id, version, definition, digest)
    VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT (tenant, release_id, version) DO NOTHING
    RETURNING digest, definition, true AS created
)
SELECT * FROM ins
UNION ALL
SELECT digest, definition, false FROM releases
 WHERE tenant = $1 AND release_id = $2 AND version = $3 AND NOT EXISTS (SELECT 1 FROM ins);

-- name: get_release
-- A release by id and version ($3 NULL: its highest version).
SELECT release_id, version, definition, digest FROM releases
 WHERE tenant = $1 AND release_id = $2 AND ($3::integer IS NULL OR version = $3)
 ORDER BY version DESC LIMIT 1;

-- name: node_runs
-- A workflow run's node runs, in the order they were created; a waiting one with what
-- its run waits for (wait_id null otherwise).
SELECT n.node_id, n.slot, n.node_run_id, n.status::text AS status, n.attempt, n.version,
       n.output, n.error, w.wait_id, w.kind AS wait_kind, w.name AS wait_name,
       w.payload AS wait_payload, w.timeout_at AS wait_timeout_at
  FROM node_runs n
  LEFT JOIN LATERAL (
      SELECT wait_id, kind, name, payload, timeout_at FROM run_waits
       WHERE run_id = n.node_run_id AND outcome IS NULL AND n.status = 'waiting'
       ORDER BY created_at DESC LIMIT 1) w ON true
 WHERE n.run_id = $1 ORDER BY n.created_at, n.node_id;

-- name: active_node_runs
-- The node runs' runs of a workflow run that an executor may still be running.
SELECT run_id FROM runs WHERE parent_run_id = $1 AND status = 'running';

-- name: list_runs
-- A page of the tenant's runs (not node runs), newest first: of status $2, runner $3 and
-- session $4 when given, submitted before seq $5, created at or after $7 and before $8;
-- a waiting one with what it waits for.
SELECT r.*, w.wait_id AS wait_id, w.kind AS wait_kind, w.name AS wait_name,
       w.payload AS wait_payload, w.timeout_at AS wait_timeout_at
  FROM runs r
  LEFT JOIN LATERAL (
        SELECT wait_id, kind, name, payload, timeout_at FROM run_waits
         WHERE run_id = r.run_id AND outcome IS NULL AND r.status = 'waiting'
         ORDER BY created_at DESC LIMIT 1) w ON true
 WHERE r.tenant = $1 AND r.parent_run_id IS NULL
   AND ($2::run_status IS NULL OR r.status = $2)
   AND ($3::text IS NULL OR r.runner = $3)
   AND ($4::text IS NULL OR r.session_id = $4)
   AND ($5::bigint IS NULL OR r.submit_seq < $5)
   AND ($7::timestamptz IS NULL OR r.created_at >= $7)
   AND ($8::timestamptz IS NULL OR r.created_at < $8)
 ORDER BY r.submit_seq DESC
 LIMIT $6;

-- name: set_schedule
-- Create or replace a schedule; its next fire is $12 (after now), whatever it was.
INSERT INTO schedules AS s (tenant, name, cron, tz, runner, input, overlap, catch_up_s,
                            paused, max_attempts, attempt_timeout_ms, next_fire_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
ON CONFLICT (tenant, name) DO UPDATE
   SET cron = EXCLUDED.cron, tz = EXCLUDED.tz, runner = EXCLUDED.runner,
       input = EXCLUDED.input, overlap = EXCLUDED.overlap, catch_up_s = EXCLUDED.catch_up_s,
       paused = EXCLUDED.paused, max_attempts = EXCLUDED.max_attempts,
       attempt_timeout_ms = EXCLUDED.attempt_timeout_ms,
       next_fire_at = EXCLUDED.next_fire_at, updated_at = now();

-- name: pause_schedules
UPDATE schedules SET paused = true, updated_at = now() WHERE tenant = $1 AND NOT paused;

-- name: remove_schedule
DELETE FROM schedules WHERE tenant = $1 AND name = $2 RETURNING name;

-- name: schedules_of
-- A tenant's schedules, by name ($2: only that one, when given).
SELECT name, cron, tz, runner, input, overlap, catch_up_s, paused,
       CASE WHEN paused THEN NULL ELSE next_fire_at END AS next_fire_at, last_fire_at,
       fired, skipped
  FROM schedules
 WHERE tenant = $1 AND ($2::text IS NULL OR name = $2)
 ORDER BY name;

-- name: backfill_schedule
-- The runs of a schedule's fires $3 (see fire_schedule), its next fire unchanged.
SELECT fire_schedule($1, $2, $3::timestamptz[], NULL, 0, $4) AS made,
       pg_current_xact_id()::text AS xact;

-- name: set_rate_limit
-- An operator's rate limit of a provider key or model ($2 requests, $3 tokens per minute;
-- NULL: not limited in that unit); what the provider said of it before is forgotten.
INSERT INTO rate_limits (key, rpm, tpm) VALUES ($1, $2, $3)
ON CONFLICT (key) DO UPDATE
   SET rpm = EXCLUDED.rpm, tpm = EXCLUDED.tpm, blocked_until = NULL, observed_at = NULL,
       tokens_left = NULL, tokens_limit = NULL, tokens_reset_at = NULL,
       requests_left = NULL, requests_limit = NULL, requests_reset_at = NULL,
       updated_at = now();

-- name: remove_rate_limit
-- The calls waiting under it are granted as they come back (the limit is gone).
DELETE FROM rate_limits WHERE key = $1 RETURNING key;

-- name: rate_limits
-- Every limit, and what its last minute holds: the calls granted, their tokens, and the
-- runs waiting for room.
SELECT l.key, l.rpm, l.tpm,
       (SELECT count(*) FROM rate_grants g
         WHERE g.key = l.key AND g.at > now() - rate_window()) AS requests,
       (SELECT coalesce(sum(g.tokens), 0) FROM rate_grants g
         WHERE g.key = l.key AND g.at > now() - rate_window())::bigint AS tokens,
       (SELECT count(*) FROM rate_waiters w JOIN runs r ON r.run_id = w.run_id
         WHERE l.key = ANY(w.keys) AND r.status = 'queued') AS waiting
  FROM rate_limits l
 ORDER BY l.key;
