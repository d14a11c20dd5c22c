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
-- STABLE as to_char is: so it is inlined where it is used, not called.
CREATE OR REPLACE FUNCTION rfc3339(p_at timestamp with time zone)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT to_char(p_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
$$;

-- Its name until the schema had one meaning of "release" (a workflow's release):
DROP FUNCTION IF EXISTS release_session_turn(text, text, text);

-- A tenant's share: the jobs its runs may have issued at once (queued for an executor or
-- running), the default times its weight; and the capacity of its queue.
CREATE OR REPLACE FUNCTION tenant_share(p_tenant text, OUT o_share integer,
    OUT o_max_queued integer)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path TO 'public', 'pg_temp'
SET plan_cache_mode TO 'force_generic_plan' AS $$
    SELECT least(d.share_runs::bigint * coalesce(b.share, 1), 2147483647)::integer,
           coalesce(b.max_queued_runs, d.max_queued_runs)
      FROM queue_defaults d LEFT JOIN tenant_budgets b ON b.tenant = p_tenant
$$;

-- How many of the tenant's runs hold a job now: queued for an executor, running or
-- recovering (a node run is its workflow run's: neither counted nor held back).
CREATE OR REPLACE FUNCTION tenant_issued(p_tenant text)
RETURNS bigint LANGUAGE sql STABLE SECURITY DEFINER SET search_path TO 'public', 'pg_temp'
SET plan_cache_mode TO 'force_generic_plan' AS $$
    SELECT count(*) FROM runs
     WHERE tenant = p_tenant AND status IN ('queued', 'running', 'recovering')
       AND job_published_at IS NOT NULL AND parent_run_id IS NULL
$$;

-- Whether a run of tenant `p_tenant` with concurrency key `p_key` must wait for its key:
-- the key's runs hold the tenant's `max_runs_per_key` jobs already (queued for an
-- executor or running). No key, or no limit: never.
CREATE OR REPLACE FUNCTION key_blocked(p_tenant text, p_key text)
RETURNS boolean LANGUAGE sql STABLE SECURITY DEFINER SET search_path TO 'public', 'pg_temp'
SET plan_cache_mode TO 'force_generic_plan' AS $$
    SELECT p_key IS NOT NULL AND EXISTS (
        SELECT 1 FROM tenant_budgets b
         WHERE b.tenant = p_tenant AND b.max_runs_per_key IS NOT NULL
           AND (SELECT count(*) FROM runs
                 WHERE tenant = p_tenant AND concurrency_key = p_key
                   AND status IN ('queued', 'running', 'recovering')
                   AND job_published_at IS NOT NULL) >= b.max_runs_per_key)
$$;

-- Its signatures before runs had concurrency keys and start times:
DROP FUNCTION IF EXISTS submit_admits(text, text);
DROP FUNCTION IF EXISTS submit_admits(text, text, text);
DROP FUNCTION IF EXISTS submit_admits(text, text, text, timestamp with time zone);

-- Whether a run of tenant `p_tenant` submitted now (for session `p_session`, or none;
-- with concurrency key `p_key`, or none; to start at `p_not_before`) gets its job at
-- once: it is due, its session is not busy, its key holds fewer jobs than the tenant's
-- limit per key, and its tenant fewer than its share (`p_issued`: the tenant's jobs, when
-- the caller counted them already; NULL: counted here). Raises RWQ02 (QUEUE_FULL) when the
-- tenant's queue is at its capacity: one tenant's flood never refuses another's submit.
CREATE OR REPLACE FUNCTION submit_admits(p_tenant text, p_session text, p_key text,
    p_not_before timestamp with time zone, p_issued bigint DEFAULT NULL)
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER SET search_path TO 'public', 'pg_temp'
SET plan_cache_mode TO 'force_generic_plan' AS $$
DECLARE
    v_share integer;
    v_max_queued integer;
    v_oldest bigint;
    v_queued bigint;
BEGIN
    SELECT o_share, o_max_queued INTO v_share, v_max_queued FROM tenant_share(p_tenant);
    -- Counting a deep queue at every submit costs as much as the queue is deep: count
    -- only when the runs submitted (by anyone) since the tenant's oldest queued run could
    -- fill its capacity.
    SELECT submit_seq INTO v_oldest FROM runs
     WHERE tenant = p_tenant AND status = 'queued' AND parent_run_id IS NULL
     ORDER BY submit_seq LIMIT 1;
    IF v_oldest IS NOT NULL AND (v_max_queued = 0 OR
        (SELECT last_value FROM runs_submit_seq_seq) - v_oldest + 1 >= v_max_queued) THEN
        SELECT count(*) INTO v_queued FROM (
            SELECT 1 FROM runs
             WHERE tenant = p_tenant AND status = 'queued' AND parent_run_id IS NULL
             LIMIT v_max_queued) q;
    ELSE
        v_queued := CASE WHEN v_oldest IS NULL THEN 0 ELSE 1 END;
    END IF;
    IF v_queued >= v_max_queued THEN
        RAISE EXCEPTION 'tenant % has % runs queued, its queue''s capacity; submit again later',
            p_tenant, v_queued USING ERRCODE = 'RWQ02';
    END IF;
    RETURN p_not_before <= now()
           AND (p_session IS NULL OR NOT session_blocked(p_tenant, p_session, NULL))
           AND (p_key IS NULL OR NOT key_blocked(p_tenant, p_key))
           AND coalesce(p_issued, tenant_issued(p_tenant)) < v_share;
END
$$;

-- The waiting runs of a tenant (of one session, or of any with `p_session` NULL) that
-- get their job now, as far as its share has room, one at a time: the highest priority
-- first, oldest first within one; but the oldest first once it has waited longer than
-- `priority_max_wait_ms` (age counts: no priority starves). None that is not due yet (a
-- delayed run), whose session is busy or whose concurrency key holds its limit. Each gets run event `p_event`; returns how many.
-- Two callers at once may each see the same room: the share is exceeded by that much,
-- never starved.
CREATE OR REPLACE FUNCTION issue_turns(p_tenant text, p_session text, p_actor text,
    p_event text, p_reason text)
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path TO 'public', 'pg_temp'
SET plan_cache_mode TO 'force_generic_plan' AS $$
DECLARE
    v_room bigint;
    v_wait interval;
    v_run uuid;
    v_at timestamp with time zone;
    released integer := 0;
BEGIN
    LOOP
        v_run := NULL;
        -- The oldest that may start: first if it waited too long.
        SELECT run_id, created_at INTO v_run, v_at FROM runs
         WHERE tenant = p_tenant AND status = 'queued' AND parent_run_id IS NULL
           AND job_published_at IS NULL AND (p_session IS NULL OR session_id = p_session)
           AND not_before <= now()
           AND (session_id IS NULL OR NOT session_blocked(tenant, session_id, submit_seq))
           AND (concurrency_key IS NULL OR NOT key_blocked(tenant, concurrency_key))
         ORDER BY submit_seq
         LIMIT 1;
        EXIT WHEN v_run IS NULL;
        -- The share's room is counted once, and only when a run waits for it.
        IF v_room IS NULL THEN
            v_room := (SELECT o_share FROM tenant_share(p_tenant)) - tenant_issued(p_tenant);
            SELECT make_interval(secs => priority_max_wait_ms / 1000.0) INTO v_wait
              FROM queue_defaults;
        END IF;
        EXIT WHEN released >= v_room;
        IF v_at <= now() - v_wait THEN
            SELECT run_id INTO v_run FROM runs
             WHERE run_id = v_run AND status = 'queued' AND job_published_at IS NULL
               FOR UPDATE SKIP LOCKED;
        ELSE
            v_run := NULL;
        END IF;
        IF v_run IS NULL THEN
            SELECT run_id INTO v_run FROM runs
             WHERE tenant = p_tenant AND status = 'queued' AND parent_run_id IS NULL
               AND job_published_at IS NULL AND (p_session IS NULL OR session_id = p_session)
               AND not_before <= now()
               AND (session_id IS NULL OR NOT session_blocked(tenant, session_id, submit_seq))
               AND (concurrency_key IS NULL OR NOT key_blocked(tenant, concurrency_key))
             ORDER BY priority DESC, submit_seq
             LIMIT 1
               FOR UPDATE SKIP LOCKED;
        END IF;
        EXIT WHEN v_run IS NULL;
        UPDATE runs SET job_published_at = now(), updated_at = now() WHERE run_id = v_run;
        INSERT INTO run_events (run_id, event, status, attempt, actor, reason)
        SELECT run_id, p_event, status, attempts, p_actor, p_reason FROM runs
         WHERE run_id = v_run;
        released := released + 1;
    END LOOP;
    RETURN released;
END
$$;
REVOKE ALL ON FUNCTION issue_turns(text, text, text, text, text) FROM PUBLIC;

-- Why a queued run has no job yet: `time` (it is delayed), `session` (an earlier run of
-- its session is active),
-- `concurrency_key` (its key's runs hold the tenant's limit), `share` (its tenant holds
-- its share of jobs), `rate_limit` (its model call waits for room under a rate limit,
-- `limit_key`); NULL for a run with a job, or not queued.
CREATE OR REPLACE FUNCTION run_queued_for(r runs)
RETURNS text LANGUAGE sql STABLE SECURITY DEFINER SET search_path TO 'public', 'pg_temp' AS $$
    SELECT CASE WHEN r.status = 'queued' AND r.limit_key IS NOT NULL
                     AND r.not_before > now() THEN 'rate_limit'
                WHEN r.status <> 'queued' OR r.job_published_at IS NOT NULL THEN NULL
                WHEN r.not_before > now() THEN 'time'
                WHEN r.session_id IS NOT NULL
                     AND session_blocked(r.tenant, r.session_id, r.submit_seq) THEN 'session'
                WHEN r.concurrency_key IS NOT NULL
                     AND key_blocked(r.tenant, r.concurrency_key) THEN 'concurrency_key'
                ELSE 'share' END
$$;

-- The reason of a run's `submitted` event: what it waits for, if anything.
CREATE OR REPLACE FUNCTION submitted_reason(r runs)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT 'submit' || CASE run_queued_for(r)
                           WHEN 'time' THEN '; waits for its start time'
                           WHEN 'session' THEN '; waits for its session'
                           WHEN 'concurrency_key' THEN '; waits for its concurrency key'
                           WHEN 'share' THEN '; waits for its tenant''s share'
                           ELSE '' END
$$;

-- The runs of a tenant waiting for its share that get their job now that it has room.
-- Called when a run of the tenant stops holding a job (it ended, or waits for an
-- answer), and by recovery.
CREATE OR REPLACE FUNCTION start_share_turn(p_tenant text, p_actor text)
RETURNS integer LANGUAGE sql SECURITY DEFINER SET search_path TO 'public', 'pg_temp' AS $$
    SELECT issue_turns(p_tenant, NULL, p_actor, 'share_turn', 'its tenant''s share has room')
$$;
REVOKE ALL ON FUNCTION start_share_turn(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION start_share_turn(text, text) TO runwire_recovery;
GRANT EXECUTE ON FUNCTION start_share_turn(text, text) TO runwire_submitter;
GRANT EXECUTE ON FUNCTION start_share_turn(text, text) TO runwire_executor;

-- The runs of a session whose turn has come (no earlier run of the session holds it)
-- get their job, as far as their tenant's share has room (the rest get it by
-- start_share_turn); returns how many. Called when a run of the session ends, and by
-- recovery when a canceled run's grace passes.
CREATE OR REPLACE FUNCTION start_session_turn(p_tenant text, p_session text, p_actor text)
RETURNS integer LANGUAGE sql SECURITY DEFINER SET search_path TO 'public', 'pg_temp' AS $$
    SELECT issue_turns(p_tenant, p_session, p_actor, 'session_turn',
                       'no earlier run of its session is active')
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
               prev_close_seq = close_seq, close_seq = NULL, limit_key = NULL,
               started_at = coalesce(started_at, now()), updated_at = now()
         WHERE run_id = p_runs[i] AND generation = p_generations[i] AND run_awaits_attempt(status)
           AND NOT cancel_requested AND not_before <= now()
           AND (attempts > 0 OR queue_timeout_ms IS NULL
                OR created_at + make_interval(secs => queue_timeout_ms / 1000.0) > now())
           AND (session_id IS NULL OR NOT session_blocked(tenant, session_id, submit_seq))
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
    v_tenants text[] := '{}';
BEGIN
    -- Each finished run makes room in its tenant's share: the turns are started once per
    -- tenant after the batch, not at each run (each start counts the tenant's jobs).
    PERFORM set_config('runwire.share_turns_later', 'on', true);
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
            -- A node run's tenant too: its workflow run may have ended with it.
            IF NOT r.tenant = ANY(v_tenants) THEN
                v_tenants := v_tenants || r.tenant;
            END IF;
            RETURN NEXT r;
        END IF;
    END LOOP;
    PERFORM set_config('runwire.share_turns_later', 'off', true);
    PERFORM start_share_turn(t, 'share') FROM unnest(v_tenants) t;
END
$$;
REVOKE ALL ON FUNCTION finish_runs(uuid[], integer[], text[], text[], text, integer[],
    text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION finish_runs(uuid[], integer[], text[], text[], text, integer[],
    text[]) TO runwire_executor;

-- Their signatures before runs had a priority, a concurrency key and a start time:
DROP FUNCTION IF EXISTS submit_runs(uuid[], text[], text[], text[], text[], text[], text[],
    integer[], integer[], integer[], text, text[], text[], bigint[], bigint[], text[],
    text[]);
DROP FUNCTION IF EXISTS insert_runs(uuid[], text[], text[], text[], text[], text[], text[],
    integer[], integer[], integer[], text, text[], text[], bigint[], bigint[], text[],
    text[]);
DROP FUNCTION IF EXISTS submit_runs(uuid[], text[], text[], text[], text[], text[], text[],
    integer[], integer[], integer[], text, text[], text[], bigint[], bigint[], text[],
    text[], integer[], text[]);
DROP FUNCTION IF EXISTS insert_runs(uuid[], text[], text[], text[], text[], text[], text[],
    integer[], integer[], integer[], text, text[], text[], bigint[], bigint[], text[],
    text[], integer[], text[]);

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
    p_budget_tokens bigint[], p_budget_costs bigint[], p_effects text[], p_workflows text[],
    p_priorities integer[], p_keys text[], p_not_befores timestamp with time zone[])
RETURNS SETOF runs LANGUAGE plpgsql SET plan_cache_mode TO 'force_generic_plan' AS $$
DECLARE
    i integer;
    r runs;
    v_effects text[];
    -- The jobs of the tenant of the run before, counted once per batch (not per run).
    v_counted text;
    v_issued bigint;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_run_ids, 1), 0) LOOP
        PERFORM submit_quota_check(p_tenants[i]);
        IF v_counted IS DISTINCT FROM p_tenants[i] THEN
            v_issued := tenant_issued(p_tenants[i]);
            v_counted := p_tenants[i];
        END IF;
        -- A run's effect kinds come as a JSON array (NULL: every kind its policy allows).
        v_effects := CASE WHEN p_effects[i] IS NULL THEN NULL ELSE
            ARRAY(SELECT jsonb_array_elements_text(p_effects[i]::jsonb)) END;
        INSERT INTO runs (run_id, tenant, request_id, session_id, multitask, runner, input,
                          metadata, max_attempts, attempt_timeout_ms, queue_timeout_ms,
                          job_published_at, created_at, updated_at, trace_parent, config_pin,
                          budget_tokens, budget_cost, effects, auth_fence, workflow,
                          priority, concurrency_key, not_before)
        VALUES (p_run_ids[i], p_tenants[i], p_request_ids[i], NULL, p_multitasks[i],
                p_runners[i], p_inputs[i]::jsonb, p_metadata[i]::jsonb, p_max_attempts[i],
                p_attempt_timeouts[i], p_queue_timeouts[i],
                CASE WHEN submit_admits(p_tenants[i], NULL, p_keys[i],
                                        coalesce(p_not_befores[i], now()), v_issued)
                     THEN now() END,
                clock_timestamp(), clock_timestamp(), p_trace_parents[i], p_config_pins[i],
                p_budget_tokens[i], p_budget_costs[i], v_effects,
                run_authorization(p_tenants[i], v_effects), p_workflows[i]::jsonb,
                coalesce(p_priorities[i], 0), p_keys[i], coalesce(p_not_befores[i], now()))
        ON CONFLICT (tenant, request_id) DO NOTHING
        RETURNING * INTO r;
        IF FOUND THEN
            INSERT INTO run_events (run_id, event, status, attempt, actor, reason, at)
            VALUES (r.run_id, 'submitted', r.status, r.attempts, p_actor,
                    submitted_reason(r), r.created_at);
            IF r.job_published_at IS NOT NULL THEN
                v_issued := v_issued + 1;
            END IF;
            RETURN NEXT r;
        END IF;
    END LOOP;
END
$$;
REVOKE ALL ON FUNCTION insert_runs(uuid[], text[], text[], text[], text[], text[], text[],
    integer[], integer[], integer[], text, text[], text[], bigint[], bigint[], text[],
    text[], integer[], text[], timestamp with time zone[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION insert_runs(uuid[], text[], text[], text[], text[], text[],
    text[], integer[], integer[], integer[], text, text[], text[], bigint[], bigint[],
    text[], text[], integer[], text[], timestamp with time zone[]) TO runwire_submitter;

-- insert_runs, and what the transaction left in the outbox that is due at once (the
-- runs' jobs), returned to the submitter to publish without reading the outbox again.
CREATE OR REPLACE FUNCTION submit_runs(p_run_ids uuid[], p_tenants text[],
    p_request_ids text[], p_multitasks text[], p_runners text[], p_inputs text[],
    p_metadata text[], p_max_attempts integer[], p_attempt_timeouts integer[],
    p_queue_timeouts integer[], p_actor text, p_trace_parents text[], p_config_pins text[],
    p_budget_tokens bigint[], p_budget_costs bigint[], p_effects text[], p_workflows text[],
    p_priorities integer[], p_keys text[], p_not_befores timestamp with time zone[])
RETURNS TABLE(o_run runs, o_messages jsonb) LANGUAGE plpgsql
SET plan_cache_mode TO 'force_generic_plan' AS $$
BEGIN
    RETURN QUERY
        SELECT r, NULL::jsonb
          FROM insert_runs(p_run_ids, p_tenants, p_request_ids, p_multitasks, p_runners,
                           p_inputs, p_metadata, p_max_attempts, p_attempt_timeouts,
                           p_queue_timeouts, p_actor, p_trace_parents, p_config_pins,
                           p_budget_tokens, p_budget_costs, p_effects, p_workflows,
                           p_priorities, p_keys, p_not_befores) r;
    -- A statement of its own: it sees what the inserts' triggers wrote.
    RETURN QUERY SELECT NULL::runs, xact_messages();
END
$$;
REVOKE ALL ON FUNCTION submit_runs(uuid[], text[], text[], text[], text[], text[], text[],
    integer[], integer[], integer[], text, text[], text[], bigint[], bigint[], text[],
    text[], integer[], text[], timestamp with time zone[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION submit_runs(uuid[], text[], text[], text[], text[], text[],
    text[], integer[], integer[], integer[], text, text[], text[], bigint[], bigint[],
    text[], text[], integer[], text[], timestamp with time zone[]) TO runwire_submitter;

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
    DELETE FROM webhook_endpoints w WHERE w.tenant = p_tenant;
    DELETE FROM schedules w WHERE w.tenant = p_tenant;
    DELETE FROM webhook_secrets w WHERE w.tenant = p_tenant;
    DELETE FROM webhook_deliveries w WHERE w.tenant = p_tenant;
    RETURN QUERY SELECT 0::bigint, v_runs, v_releases;
END
$$;
REVOKE ALL ON FUNCTION forget_tenant(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION forget_tenant(text) TO runwire_submitter;
