-- A run's life: its status classes, its submit, claim and finish, its session's turn.
-- The current definition of each function and trigger here: edit them in this file, never
-- in a migration (runwire.runtime.store.schema applies the files when they change).

-- Whether a run of session `p_session` accepted after `p_before` (NULL: a run not yet
-- accepted) must wait: some earlier run of the session is queued, running or recovering,
-- and is not a canceled run past its deadline. The one definition of "the session is
-- busy", used by submit, claim and release alike. A run that is not blocked never becomes
-- blocked again: earlier runs only end, and a deadline only passes.
CREATE OR REPLACE FUNCTION session_blocked(p_tenant text, p_session text, p_before bigint)
RETURNS boolean LANGUAGE sql STABLE SET plan_cache_mode TO 'force_generic_plan' AS $$
    SELECT EXISTS (
        SELECT 1 FROM runs e
         WHERE e.tenant = p_tenant AND e.session_id = p_session
           AND (p_before IS NULL OR e.submit_seq < p_before)
           AND run_active(e.status)
           AND (e.cancel_deadline IS NULL OR e.cancel_deadline > now()))
$$;

-- Queued, running, recovering or waiting: the run holds its session and may still change.
CREATE OR REPLACE FUNCTION run_active(p_status run_status)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_status IN ('queued', 'running', 'recovering', 'waiting')
$$;

-- Its name until a run could be 'waiting' (for an answer, not for an attempt):
DROP FUNCTION IF EXISTS run_waiting(run_status);

-- Queued or recovering: the run waits for an attempt.
CREATE OR REPLACE FUNCTION run_awaits_attempt(p_status run_status)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_status IN ('queued', 'recovering')
$$;

-- Finished, failed, canceled or interrupted: the run never changes again.
CREATE OR REPLACE FUNCTION run_terminal(p_status run_status)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT NOT run_active(p_status)
$$;

-- A time as the wire writes it: RFC 3339 in UTC, whatever the session's time zone.
CREATE OR REPLACE FUNCTION rfc3339(p_at timestamp with time zone)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT to_char(p_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
$$;

-- Its name until the schema had one meaning of "release" (a workflow's release):
DROP FUNCTION IF EXISTS release_session_turn(text, text, text);

-- The runs of a session whose turn has come (no earlier run of the session holds it)
-- get their job; returns how many. Called when a run of the session ends, and by
-- recovery when a canceled run's grace passes.
CREATE OR REPLACE FUNCTION start_session_turn(p_tenant text, p_session text, p_actor text)
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path TO 'public', 'pg_temp'
SET plan_cache_mode TO 'force_generic_plan' AS $$
DECLARE
    released integer;
BEGIN
    WITH due AS (
        SELECT run_id FROM runs
         WHERE tenant = p_tenant AND session_id = p_session
           AND status = 'queued' AND job_published_at IS NULL
           AND NOT session_blocked(tenant, session_id, submit_seq)
         ORDER BY submit_seq
           FOR UPDATE SKIP LOCKED
    ), upd AS (
        UPDATE runs r SET job_published_at = now(), updated_at = now()
          FROM due WHERE r.run_id = due.run_id
        RETURNING r.*
    )
    INSERT INTO run_events (run_id, event, status, attempt, actor, reason)
    SELECT run_id, 'session_turn', status, attempts, p_actor,
           'no earlier run of its session is active'
      FROM upd;
    GET DIAGNOSTICS released = ROW_COUNT;
    RETURN released;
END
$$;
REVOKE ALL ON FUNCTION start_session_turn(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION start_session_turn(text, text, text) TO runwire_recovery;

-- A node run is a part of its workflow run: quotas count workflow runs, not their nodes.
CREATE OR REPLACE FUNCTION submit_quota_check(p_tenant text)
RETURNS boolean LANGUAGE plpgsql SET plan_cache_mode TO 'force_generic_plan' AS $$
DECLARE
    v_quota tenant_budgets;
    v_count bigint;
BEGIN
    SELECT * INTO v_quota FROM tenant_budgets WHERE tenant = p_tenant;
    IF NOT FOUND OR (v_quota.max_active_runs IS NULL AND v_quota.max_runs_per_day IS NULL) THEN
        RETURN true;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('runwire.quota'), hashtext(p_tenant));
    IF v_quota.max_active_runs IS NOT NULL THEN
        SELECT count(*) INTO v_count FROM runs
         WHERE tenant = p_tenant AND run_active(status) AND parent_run_id IS NULL;
        IF v_count >= v_quota.max_active_runs THEN
            RAISE EXCEPTION 'tenant % has % active runs; its quota is %',
                p_tenant, v_count, v_quota.max_active_runs USING ERRCODE = 'RWQ01';
        END IF;
    END IF;
    IF v_quota.max_runs_per_day IS NOT NULL THEN
        SELECT count(*) INTO v_count FROM runs
         WHERE tenant = p_tenant AND parent_run_id IS NULL
           AND created_at >= date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
        IF v_count >= v_quota.max_runs_per_day THEN
            RAISE EXCEPTION 'tenant % submitted % runs today (UTC); its quota is %',
                p_tenant, v_count, v_quota.max_runs_per_day USING ERRCODE = 'RWQ01';
        END IF;
    END IF;
    RETURN true;
END
$$;

-- The authorization fence of a run: a digest of its own permissions and of its tenant's
-- policy as it stands now.
CREATE OR REPLACE FUNCTION run_authorization(p_tenant text, p_effects text[])
RETURNS text LANGUAGE sql STABLE SET plan_cache_mode TO 'force_generic_plan' AS $$
    SELECT md5(coalesce(p_effects::text, '*') || '|' || coalesce(p.effects::text, '*')
               || '|' || coalesce(p.version, 0))
      FROM (SELECT 1) one LEFT JOIN tenant_policies p ON p.tenant = p_tenant
$$;

-- An executor claims the jobs it fetched together: the claims of one batch are one
-- statement and one commit. Each claim is the `claim_run` statement, run one after the
-- other in the order given (the executor sorts them by run id, the order every
-- statement that writes several runs takes), so each sees the ones before it: two runs
-- of one session are never both started. Returns the runs it claimed.
CREATE OR REPLACE FUNCTION claim_runs(p_runs uuid[], p_generations integer[], p_owner text,
    p_lease_ms integer, p_job_acks text[], p_presence integer)
RETURNS SETOF runs LANGUAGE plpgsql SET plan_cache_mode TO 'force_generic_plan' AS $$
DECLARE
    i integer;
    r runs;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_runs, 1), 0) LOOP
        UPDATE runs
           SET status = 'running', attempts = attempts + 1, generation = generation + 1,
               lease_owner = p_owner,
               lease_expires_at = now() + make_interval(secs => p_lease_ms / 1000.0),
               job_ack = p_job_acks[i], lease_presence = p_presence,
               prev_close_seq = close_seq, close_seq = NULL,
               started_at = coalesce(started_at, now()), updated_at = now()
         WHERE run_id = p_runs[i] AND generation = p_generations[i] AND run_awaits_attempt(status)
           AND NOT cancel_requested AND not_before <= now()
           AND (attempts > 0 OR queue_timeout_ms IS NULL
                OR created_at + make_interval(secs => queue_timeout_ms / 1000.0) > now())
           AND NOT session_blocked(tenant, session_id, submit_seq)
        RETURNING * INTO r;
        IF FOUND THEN
            INSERT INTO run_events (run_id, event, status, attempt, actor, reason)
            VALUES (r.run_id, 'claimed', r.status, r.attempts, p_owner, 'attempt started');
            RETURN NEXT r;
        END IF;
    END LOOP;
END
$$;
REVOKE ALL ON FUNCTION claim_runs(uuid[], integer[], text, integer, text[],
    integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION claim_runs(uuid[], integer[], text, integer, text[],
    integer) TO runwire_executor;

-- An executor records the runs its attempts finished at the same moment together: one
-- statement and one commit. Each is the `finish_run` statement, run one after the other
-- in the order given (the executor sorts them by run id), with what it implies written
-- by the same triggers. Returns the runs it finished.
CREATE OR REPLACE FUNCTION finish_runs(p_runs uuid[], p_generations integer[],
    p_results text[], p_texts text[], p_actor text, p_close_seqs integer[],
    p_trace_parents text[])
RETURNS SETOF runs LANGUAGE plpgsql SET plan_cache_mode TO 'force_generic_plan' AS $$
DECLARE
    i integer;
    r runs;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_runs, 1), 0) LOOP
        UPDATE runs
           SET status = 'finished', result = p_results[i]::jsonb, partial_text = p_texts[i],
               error = NULL, close_seq = p_close_seqs[i],
               implied_trace_parent = p_trace_parents[i], lease_owner = NULL,
               lease_expires_at = NULL, ended_at = now(), updated_at = now()
         WHERE run_id = p_runs[i] AND generation = p_generations[i] AND status = 'running'
        RETURNING * INTO r;
        IF FOUND THEN
            INSERT INTO run_events (run_id, event, status, attempt, actor, reason)
            VALUES (r.run_id, 'finished', r.status, r.attempts, p_actor, 'runner returned');
            RETURN NEXT r;
        END IF;
    END LOOP;
END
$$;
REVOKE ALL ON FUNCTION finish_runs(uuid[], integer[], text[], text[], text, integer[],
    text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION finish_runs(uuid[], integer[], text[], text[], text, integer[],
    text[]) TO runwire_executor;

-- The submitter inserts the runs submitted at the same moment (outside a session) in one
-- statement and one commit. Each is the `insert_run` statement, run one after the other
-- in the order given, so each sees the ones before it: a tenant's quota counts every
-- run of the batch before it, and a request_id used twice in one batch is inserted once.
-- A quota that refuses one run raises (RWQ01) for the whole batch: the submitter then
-- inserts its runs one by one, so that only the refused run fails. Returns the runs it
-- inserted (a request_id used before inserts nothing).
CREATE OR REPLACE FUNCTION insert_runs(p_run_ids uuid[], p_tenants text[],
    p_request_ids text[], p_multitasks text[], p_runners text[], p_inputs text[],
    p_metadata text[], p_max_attempts integer[], p_attempt_timeouts integer[],
    p_queue_timeouts integer[], p_actor text, p_trace_parents text[], p_config_pins text[],
    p_budget_tokens bigint[], p_budget_costs bigint[], p_effects text[], p_workflows text[])
RETURNS SETOF runs LANGUAGE plpgsql SET plan_cache_mode TO 'force_generic_plan' AS $$
DECLARE
    i integer;
    r runs;
    v_effects text[];
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_run_ids, 1), 0) LOOP
        PERFORM submit_quota_check(p_tenants[i]);
        -- A run's effect kinds come as a JSON array (NULL: every kind its policy allows).
        v_effects := CASE WHEN p_effects[i] IS NULL THEN NULL ELSE
            ARRAY(SELECT jsonb_array_elements_text(p_effects[i]::jsonb)) END;
        INSERT INTO runs (run_id, tenant, request_id, session_id, multitask, runner, input,
                          metadata, max_attempts, attempt_timeout_ms, queue_timeout_ms,
                          job_published_at, created_at, updated_at, trace_parent, config_pin,
                          budget_tokens, budget_cost, effects, auth_fence, workflow)
        VALUES (p_run_ids[i], p_tenants[i], p_request_ids[i], NULL, p_multitasks[i],
                p_runners[i], p_inputs[i]::jsonb, p_metadata[i]::jsonb, p_max_attempts[i],
                p_attempt_timeouts[i], p_queue_timeouts[i], now(), clock_timestamp(),
                clock_timestamp(), p_trace_parents[i], p_config_pins[i], p_budget_tokens[i],
                p_budget_costs[i], v_effects, run_authorization(p_tenants[i], v_effects),
                p_workflows[i]::jsonb)
        ON CONFLICT (tenant, request_id) DO NOTHING
        RETURNING * INTO r;
        IF FOUND THEN
            INSERT INTO run_events (run_id, event, status, attempt, actor, reason, at)
            VALUES (r.run_id, 'submitted', r.status, r.attempts, p_actor, 'submit',
                    r.created_at);
            RETURN NEXT r;
        END IF;
    END LOOP;
END
$$;
REVOKE ALL ON FUNCTION insert_runs(uuid[], text[], text[], text[], text[], text[], text[],
    integer[], integer[], integer[], text, text[], text[], bigint[], bigint[], text[],
    text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION insert_runs(uuid[], text[], text[], text[], text[], text[],
    text[], integer[], integer[], integer[], text, text[], text[], bigint[], bigint[],
    text[], text[]) TO runwire_submitter;

-- insert_runs, and what the transaction left in the outbox that is due at once (the
-- runs' jobs), returned to the submitter to publish without reading the outbox again.
CREATE OR REPLACE FUNCTION submit_runs(p_run_ids uuid[], p_tenants text[],
    p_request_ids text[], p_multitasks text[], p_runners text[], p_inputs text[],
    p_metadata text[], p_max_attempts integer[], p_attempt_timeouts integer[],
    p_queue_timeouts integer[], p_actor text, p_trace_parents text[], p_config_pins text[],
    p_budget_tokens bigint[], p_budget_costs bigint[], p_effects text[], p_workflows text[])
RETURNS TABLE(o_run runs, o_messages jsonb) LANGUAGE plpgsql
SET plan_cache_mode TO 'force_generic_plan' AS $$
BEGIN
    RETURN QUERY
        SELECT r, NULL::jsonb
          FROM insert_runs(p_run_ids, p_tenants, p_request_ids, p_multitasks, p_runners,
                           p_inputs, p_metadata, p_max_attempts, p_attempt_timeouts,
                           p_queue_timeouts, p_actor, p_trace_parents, p_config_pins,
                           p_budget_tokens, p_budget_costs, p_effects, p_workflows) r;
    -- A statement of its own: it sees what the inserts' triggers wrote.
    RETURN QUERY SELECT NULL::runs, xact_messages();
END
$$;
REVOKE ALL ON FUNCTION submit_runs(uuid[], text[], text[], text[], text[], text[], text[],
    integer[], integer[], integer[], text, text[], text[], bigint[], bigint[], text[],
    text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION submit_runs(uuid[], text[], text[], text[], text[], text[],
    text[], integer[], integer[], integer[], text, text[], text[], bigint[], bigint[],
    text[], text[]) TO runwire_submitter;

-- finish_runs, and what the transaction left in the outbox that is due at once (the
-- runs' `done` frames, the next run of a session): the runs' rows, then one row
-- without a run whose `messages` are those.
CREATE OR REPLACE FUNCTION finish_runs_told(p_runs uuid[], p_generations integer[],
    p_results text[], p_texts text[], p_actor text, p_close_seqs integer[],
    p_trace_parents text[])
RETURNS TABLE(o_run runs, o_messages jsonb) LANGUAGE plpgsql
SET plan_cache_mode TO 'force_generic_plan' AS $$
BEGIN
    RETURN QUERY
        SELECT r, NULL::jsonb
          FROM finish_runs(p_runs, p_generations, p_results, p_texts, p_actor, p_close_seqs,
                           p_trace_parents) r;
    RETURN QUERY SELECT NULL::runs, xact_messages();
END
$$;
REVOKE ALL ON FUNCTION finish_runs_told(uuid[], integer[], text[], text[], text, integer[],
    text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION finish_runs_told(uuid[], integer[], text[], text[], text,
    integer[], text[]) TO runwire_executor;

-- A removed tenant forgotten (an operator's forget_tenant, after its end_tenant): its
-- runs, with all that hangs off them (frames, events, attempts' effects and reservations,
-- node runs), its outbox, releases, budget, spend and policy, so that a tenant given its
-- name later inherits nothing. Nothing is deleted while a run of it is still active, or
-- ended but its last frames not stored by the relay yet (they would reach the stream after
-- its purge), unless that was long ago (a relay's lost write is not waited for).
CREATE OR REPLACE FUNCTION forget_tenant(p_tenant text)
RETURNS TABLE(o_active bigint, o_runs bigint, o_releases bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path TO 'public', 'pg_temp'
AS $$
DECLARE
    v_active bigint;
    v_runs bigint;
    v_releases bigint;
BEGIN
    SELECT count(*) INTO v_active FROM runs r
     WHERE r.tenant = p_tenant
       AND (run_active(r.status)
            OR (NOT r.frames_closed AND r.ended_at > now() - interval '30 seconds'));
    IF v_active > 0 THEN
        RETURN QUERY SELECT v_active, 0::bigint, 0::bigint;
        RETURN;
    END IF;
    DELETE FROM outbox o WHERE o.tenant = p_tenant;
    WITH gone AS (DELETE FROM runs r WHERE r.tenant = p_tenant RETURNING 1)
    SELECT count(*) INTO v_runs FROM gone;
    WITH gone AS (DELETE FROM releases x WHERE x.tenant = p_tenant RETURNING 1)
    SELECT count(*) INTO v_releases FROM gone;
    DELETE FROM tenant_budgets b WHERE b.tenant = p_tenant;
    DELETE FROM tenant_spend s WHERE s.tenant = p_tenant;
    DELETE FROM tenant_policies p WHERE p.tenant = p_tenant;
    RETURN QUERY SELECT 0::bigint, v_runs, v_releases;
END
$$;
REVOKE ALL ON FUNCTION forget_tenant(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION forget_tenant(text) TO runwire_submitter;
