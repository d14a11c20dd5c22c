-- runwire's schema: what the migrations and sql/functions/ make of an empty database,
-- dumped by PostgreSQL 18 (`make schema` writes this file; never edit it by hand).

SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET transaction_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

CREATE TYPE public.effect_state AS ENUM (
    'prepared',
    'claimed',
    'committed',
    'failed',
    'unknown',
    'reconciled'
);

CREATE TYPE public.node_status AS ENUM (
    'ready',
    'running',
    'waiting',
    'completed',
    'failed',
    'timed_out',
    'skipped'
);

CREATE TYPE public.outbox_kind AS ENUM (
    'job',
    'frame',
    'event'
);

CREATE TYPE public.run_status AS ENUM (
    'queued',
    'running',
    'recovering',
    'waiting',
    'finished',
    'failed',
    'canceled',
    'interrupted'
);

CREATE FUNCTION public.budget_charge(p_state text, p_held bigint, p_used bigint) RETURNS bigint
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT CASE p_state WHEN 'released' THEN 0 WHEN 'settled' THEN coalesce(p_used, 0)
                        ELSE p_held END
$$;

CREATE FUNCTION public.budget_reserve(p_run uuid, p_key text, p_tokens bigint, p_cost bigint, p_generation integer) RETURNS TABLE(granted boolean, tenant_left bigint, run_left bigint, tenant_cost_left bigint, run_cost_left bigint)
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_run runs;
    v_owner runs;
    v_limit tenant_budgets;
    v_spent tenant_spend;
    v_run_tokens bigint;
    v_run_cost bigint;
BEGIN
    SELECT * INTO v_run FROM runs WHERE run_id = p_run;
    IF NOT FOUND OR v_run.generation <> p_generation OR v_run.status <> 'running' THEN
        RETURN;  -- no row: the attempt no longer holds the run
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('runwire.budget'), hashtext(v_run.tenant));
    IF EXISTS (SELECT 1 FROM budget_reservations WHERE run_id = p_run AND key = p_key) THEN
        RETURN QUERY SELECT true, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint;
        RETURN;
    END IF;
    v_owner := v_run;
    IF v_run.parent_run_id IS NOT NULL THEN
        SELECT * INTO v_owner FROM runs WHERE run_id = v_run.parent_run_id;
    END IF;
    SELECT * INTO v_limit FROM tenant_budgets WHERE tenant = v_run.tenant;
    SELECT * INTO v_spent FROM tenant_spend WHERE tenant = v_run.tenant;
    SELECT coalesce(sum(budget_charge(state, tokens, used)), 0),
           coalesce(sum(budget_charge(state, cost, cost_used)), 0)
      INTO v_run_tokens, v_run_cost
      FROM budget_reservations
     WHERE run_id = v_owner.run_id
        OR (v_owner.workflow IS NOT NULL
            AND run_id IN (SELECT run_id FROM runs WHERE parent_run_id = v_owner.run_id));
    tenant_left := v_limit.tokens - coalesce(v_spent.tokens, 0);
    run_left := v_owner.budget_tokens - v_run_tokens;
    tenant_cost_left := v_limit.cost - coalesce(v_spent.cost, 0);
    run_cost_left := v_owner.budget_cost - v_run_cost;
    IF p_tokens > coalesce(tenant_left, p_tokens) OR p_tokens > coalesce(run_left, p_tokens)
       OR p_cost > coalesce(tenant_cost_left, p_cost) OR p_cost > coalesce(run_cost_left, p_cost)
    THEN
        granted := false;
        RETURN NEXT;
        RETURN;
    END IF;
    INSERT INTO budget_reservations (run_id, key, tenant, generation, tokens, cost)
    VALUES (p_run, p_key, v_run.tenant, p_generation, p_tokens, p_cost);
    INSERT INTO run_events (run_id, event, status, attempt, actor, reason)
    VALUES (p_run, 'budget_reserved', v_run.status, v_run.attempts,
            coalesce(v_run.lease_owner, 'executor'),
            p_key || ': ' || p_tokens || ' tokens'
                  || CASE WHEN p_cost > 0 THEN ', ' || p_cost || ' cost units' ELSE '' END);
    granted := true;
    tenant_left := tenant_left - p_tokens;
    run_left := run_left - p_tokens;
    tenant_cost_left := tenant_cost_left - p_cost;
    run_cost_left := run_cost_left - p_cost;
    RETURN NEXT;
END
$$;

CREATE FUNCTION public.budget_spend_track() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
DECLARE
    v_tokens bigint := budget_charge(NEW.state, NEW.tokens, NEW.used);
    v_cost bigint := budget_charge(NEW.state, NEW.cost, NEW.cost_used);
BEGIN
    IF TG_OP = 'UPDATE' THEN
        v_tokens := v_tokens - budget_charge(OLD.state, OLD.tokens, OLD.used);
        v_cost := v_cost - budget_charge(OLD.state, OLD.cost, OLD.cost_used);
    END IF;
    IF v_tokens <> 0 OR v_cost <> 0 THEN
        INSERT INTO tenant_spend AS s (tenant, tokens, cost) VALUES (NEW.tenant, v_tokens, v_cost)
        ON CONFLICT (tenant) DO UPDATE
           SET tokens = s.tokens + EXCLUDED.tokens, cost = s.cost + EXCLUDED.cost;
    END IF;
    RETURN NULL;
END
$$;

SET default_tablespace = '';

SET default_table_access_method = heap;

CREATE TABLE public.runs (
    run_id uuid NOT NULL,
    tenant text NOT NULL,
    request_id text NOT NULL,
    session_id text,
    multitask text NOT NULL,
    runner text NOT NULL,
    input jsonb NOT NULL,
    metadata jsonb DEFAULT '{}'::jsonb NOT NULL,
    status public.run_status DEFAULT 'queued'::public.run_status NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    max_attempts integer NOT NULL,
    generation integer DEFAULT 0 NOT NULL,
    attempt_timeout_ms integer NOT NULL,
    queue_timeout_ms integer,
    not_before timestamp with time zone DEFAULT now() NOT NULL,
    job_published_at timestamp with time zone,
    lease_owner text,
    lease_expires_at timestamp with time zone,
    cancel_requested boolean DEFAULT false NOT NULL,
    partial_text text DEFAULT ''::text NOT NULL,
    checkpoint jsonb,
    checkpoint_version integer DEFAULT 0 NOT NULL,
    recoveries integer DEFAULT 0 NOT NULL,
    recovery_checkpoint integer DEFAULT 0 NOT NULL,
    last_seq bigint DEFAULT 0 NOT NULL,
    frame_count bigint DEFAULT 0 NOT NULL,
    frames_closed boolean DEFAULT false NOT NULL,
    result jsonb,
    error jsonb,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    started_at timestamp with time zone,
    ended_at timestamp with time zone,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    submit_seq bigint NOT NULL,
    cancel_error jsonb,
    cancel_deadline timestamp with time zone,
    stream_purged_at timestamp with time zone,
    frames_expired_at timestamp with time zone,
    job_ack text,
    trace_parent text,
    close_seq integer,
    implied_trace_parent text,
    job_checked_at timestamp with time zone,
    config_pin text,
    budget_tokens bigint,
    budget_cost bigint,
    effects text[],
    auth_fence text,
    frame_secret text,
    workflow jsonb,
    parent_run_id uuid,
    node_id text,
    retry_base_ms integer,
    lease_presence integer,
    prev_close_seq integer,
    waits integer DEFAULT 0 NOT NULL,
    priority smallint DEFAULT 0 NOT NULL,
    concurrency_key text,
    limit_key text
);

CREATE FUNCTION public.claim_runs(p_runs uuid[], p_generations integer[], p_owner text, p_lease_ms integer, p_job_acks text[], p_presence integer) RETURNS SETOF public.runs
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
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

CREATE TABLE public.run_waits (
    run_id uuid NOT NULL,
    wait_id text NOT NULL,
    kind text NOT NULL,
    name text,
    payload jsonb,
    timeout_at timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    outcome text,
    value jsonb,
    request_id text,
    decided_at timestamp with time zone,
    taken_generation integer,
    CONSTRAINT run_waits_kind_check CHECK ((kind = ANY (ARRAY['interrupt'::text, 'signal'::text, 'sleep'::text]))),
    CONSTRAINT run_waits_outcome_check CHECK ((outcome = ANY (ARRAY['answered'::text, 'timed_out'::text])))
);

CREATE FUNCTION public.decide_by_parent_signal(p_parent uuid, p_wait public.run_waits) RETURNS public.run_waits
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
DECLARE
    v_signal run_signals;
    v_wait run_waits := p_wait;
BEGIN
    IF p_wait.timeout_at <= now() THEN
        RETURN v_wait;  -- past its deadline: it times out (see the top of this file)
    END IF;
    v_signal := take_parent_signal(p_parent, p_wait.run_id, p_wait.wait_id, p_wait.name);
    IF v_signal.seq IS NOT NULL THEN
        UPDATE run_waits
           SET outcome = 'answered', value = v_signal.payload,
               request_id = v_signal.request_id, decided_at = now()
         WHERE run_id = p_wait.run_id AND wait_id = p_wait.wait_id AND outcome IS NULL
        RETURNING * INTO v_wait;
    END IF;
    RETURN v_wait;
END
$$;

CREATE FUNCTION public.deliver_kept_signal(p_tenant text, p_run_id uuid, p_actor text) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
DECLARE
    v_due record;
    v_wait run_waits;
    v_signal run_signals;
BEGIN
    SELECT w.run_id, w.wait_id INTO v_due
      FROM run_signals s
      JOIN runs c ON c.parent_run_id = s.run_id AND run_active(c.status)
      JOIN run_waits w ON w.run_id = c.run_id AND w.outcome IS NULL AND w.kind = 'signal'
                      AND w.name = s.name AND (w.timeout_at IS NULL OR w.timeout_at > now())
     WHERE s.run_id = p_run_id AND s.taken_by IS NULL
       AND EXISTS (SELECT 1 FROM runs p WHERE p.run_id = p_run_id AND p.tenant = p_tenant)
     ORDER BY s.seq, w.created_at LIMIT 1;
    IF NOT FOUND THEN
        RETURN 'none';
    END IF;
    PERFORM 1 FROM runs WHERE run_id = v_due.run_id FOR UPDATE;
    SELECT * INTO v_wait FROM run_waits
     WHERE run_id = v_due.run_id AND wait_id = v_due.wait_id AND outcome IS NULL;
    IF NOT FOUND THEN
        RETURN 'again';
    END IF;
    v_wait := decide_by_parent_signal(p_run_id, v_wait);
    IF v_wait.outcome IS NULL THEN
        RETURN 'again';
    END IF;
    PERFORM wake_run(v_due.run_id, p_actor, 'signaled');
    RETURN 'delivered';
END
$$;

CREATE FUNCTION public.effect_budget_close() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
DECLARE
    v_run runs;
    v_key text := 'effect:' || NEW.key;
    v_row budget_reservations;
    -- Charged because it may have happened, now known not to have.
    v_corrected boolean := OLD.state = 'failed'
                           AND OLD.error_code = 'EFFECT_DEADLINE_EXCEEDED'
                           AND NEW.error_code IS DISTINCT FROM 'EFFECT_DEADLINE_EXCEEDED';
BEGIN
    IF NEW.state NOT IN ('committed', 'reconciled', 'failed')
       OR (NEW.state = OLD.state AND NOT v_corrected) THEN
        RETURN NULL;
    END IF;
    IF NEW.state = 'failed' AND NEW.error_code IS DISTINCT FROM 'EFFECT_DEADLINE_EXCEEDED' THEN
        UPDATE budget_reservations SET state = 'released', settled_at = now()
         WHERE run_id = NEW.run_id AND key = v_key
           AND (state = 'reserved' OR (v_corrected AND state = 'settled'))
        RETURNING * INTO v_row;
    ELSE
        UPDATE budget_reservations
           SET state = 'settled', used = tokens, cost_used = cost, settled_at = now(),
               receipt = 'effect ' || NEW.state
         WHERE run_id = NEW.run_id AND key = v_key AND state = 'reserved'
        RETURNING * INTO v_row;
    END IF;
    IF v_row.run_id IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT * INTO v_run FROM runs WHERE run_id = NEW.run_id;
    INSERT INTO run_events (run_id, event, status, attempt, actor, reason)
    VALUES (NEW.run_id,
            CASE v_row.state WHEN 'settled' THEN 'budget_settled' ELSE 'budget_released' END,
            v_run.status, v_run.attempts, coalesce(v_run.lease_owner, 'executor'),
            v_key || ': effect ' || NEW.state);
    RETURN NULL;
END
$$;

CREATE FUNCTION public.enter_waiting(p_run_id uuid, p_generation integer, p_wait_id text, p_text text, p_actor text, p_close_seq integer, p_trace_parent text, p_cancel_error jsonb) RETURNS SETOF public.runs
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
DECLARE
    v_run runs;
    v_decided boolean;
    v_parent uuid;
    v_wait run_waits;
BEGIN
    SELECT parent_run_id INTO v_parent FROM runs
     WHERE run_id = p_run_id AND generation = p_generation AND status = 'running'
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT * INTO v_wait FROM run_waits WHERE run_id = p_run_id AND wait_id = p_wait_id;
    -- A node's signal sent to its workflow run since the wait began (see
    -- deliver_kept_signal: one of the two always sees the other).
    IF v_wait.outcome IS NULL AND v_wait.kind = 'signal' AND v_parent IS NOT NULL THEN
        v_wait := decide_by_parent_signal(v_parent, v_wait);
    END IF;
    v_decided := v_wait.outcome IS NOT NULL;
    UPDATE runs
       SET status = CASE WHEN cancel_requested THEN 'canceled'::run_status
                         WHEN v_decided THEN 'queued'::run_status
                         ELSE 'waiting'::run_status END,
           error = CASE WHEN cancel_requested THEN coalesce(cancel_error, p_cancel_error)
                        ELSE error END,
           ended_at = CASE WHEN cancel_requested THEN now() END,
           job_published_at = CASE WHEN v_decided AND NOT cancel_requested THEN now()
                                   ELSE job_published_at END,
           waits = waits + 1, partial_text = p_text, not_before = now(),
           lease_owner = NULL, lease_expires_at = NULL,
           close_seq = CASE WHEN v_decided AND NOT cancel_requested THEN p_close_seq - 1
                            ELSE p_close_seq END,
           implied_trace_parent = p_trace_parent, updated_at = now()
     WHERE run_id = p_run_id
    RETURNING * INTO v_run;
    INSERT INTO run_events (run_id, event, status, attempt, actor, code, reason)
    VALUES (v_run.run_id,
            CASE v_run.status WHEN 'canceled' THEN 'canceled' WHEN 'queued' THEN 'resumed'
                              ELSE 'waiting' END,
            v_run.status, v_run.attempts, p_actor, v_run.error->>'code', p_wait_id);
    RETURN NEXT v_run;
END
$$;

CREATE FUNCTION public.finish_runs(p_runs uuid[], p_generations integer[], p_results text[], p_texts text[], p_actor text, p_close_seqs integer[], p_trace_parents text[]) RETURNS SETOF public.runs
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
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

CREATE FUNCTION public.finish_runs_told(p_runs uuid[], p_generations integer[], p_results text[], p_texts text[], p_actor text, p_close_seqs integer[], p_trace_parents text[]) RETURNS TABLE(o_run public.runs, o_messages jsonb)
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
BEGIN
    RETURN QUERY
        SELECT r, NULL::jsonb
          FROM finish_runs(p_runs, p_generations, p_results, p_texts, p_actor, p_close_seqs,
                           p_trace_parents) r;
    RETURN QUERY SELECT NULL::runs, xact_messages();
END
$$;

CREATE FUNCTION public.fire_schedule(p_tenant text, p_name text, p_fires timestamp with time zone[], p_next timestamp with time zone, p_skipped integer, p_actor text) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
DECLARE
    s schedules;
    r runs;
    v_fire timestamp with time zone;
    v_session text;
    v_admit boolean;
    v_made integer := 0;
    v_skipped integer := p_skipped;
BEGIN
    SELECT * INTO s FROM schedules WHERE tenant = p_tenant AND name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    v_session := CASE WHEN s.overlap = 'allow' THEN NULL ELSE 'schedule:' || s.name END;
    FOREACH v_fire IN ARRAY coalesce(p_fires, '{}') LOOP
        IF s.overlap = 'skip' AND session_blocked(p_tenant, v_session, NULL) THEN
            v_skipped := v_skipped + 1;
            CONTINUE;
        END IF;
        BEGIN
            PERFORM submit_quota_check(p_tenant);
            v_admit := submit_admits(p_tenant, v_session, NULL, now());
        EXCEPTION WHEN SQLSTATE 'RWQ01' OR SQLSTATE 'RWQ02' THEN
            v_skipped := v_skipped + 1;
            CONTINUE;
        END;
        INSERT INTO runs (run_id, tenant, request_id, session_id, multitask, runner, input,
                          metadata, max_attempts, attempt_timeout_ms, job_published_at,
                          created_at, updated_at, auth_fence)
        VALUES (gen_random_uuid(), p_tenant, 'schedule:' || s.name || ':' || rfc3339(v_fire),
                v_session, 'enqueue', s.runner, s.input,
                jsonb_build_object('schedule', s.name, 'fire_at', rfc3339(v_fire)),
                s.max_attempts, s.attempt_timeout_ms, CASE WHEN v_admit THEN now() END,
                clock_timestamp(), clock_timestamp(), run_authorization(p_tenant, NULL))
        ON CONFLICT (tenant, request_id) DO NOTHING
        RETURNING * INTO r;
        IF FOUND THEN
            INSERT INTO run_events (run_id, event, status, attempt, actor, reason, at)
            VALUES (r.run_id, 'submitted', r.status, r.attempts, p_actor,
                    'schedule ' || s.name || ', its fire at ' || rfc3339(v_fire), r.created_at);
            v_made := v_made + 1;
        END IF;
    END LOOP;
    UPDATE schedules
       SET next_fire_at = coalesce(p_next, next_fire_at),
           last_fire_at = greatest(last_fire_at, (SELECT max(f) FROM unnest(p_fires) f)),
           fired = fired + v_made, skipped = skipped + v_skipped, updated_at = now()
     WHERE tenant = p_tenant AND name = p_name;
    RETURN v_made;
END
$$;

CREATE FUNCTION public.forget_tenant(p_tenant text) RETURNS TABLE(o_active bigint, o_runs bigint, o_releases bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
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

CREATE FUNCTION public.insert_runs(p_run_ids uuid[], p_tenants text[], p_request_ids text[], p_multitasks text[], p_runners text[], p_inputs text[], p_metadata text[], p_max_attempts integer[], p_attempt_timeouts integer[], p_queue_timeouts integer[], p_actor text, p_trace_parents text[], p_config_pins text[], p_budget_tokens bigint[], p_budget_costs bigint[], p_effects text[], p_workflows text[], p_priorities integer[], p_keys text[], p_not_befores timestamp with time zone[]) RETURNS SETOF public.runs
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
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

CREATE FUNCTION public.issue_turns(p_tenant text, p_session text, p_actor text, p_event text, p_reason text) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
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

CREATE FUNCTION public.key_blocked(p_tenant text, p_key text) RETURNS boolean
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
    SELECT p_key IS NOT NULL AND EXISTS (
        SELECT 1 FROM tenant_budgets b
         WHERE b.tenant = p_tenant AND b.max_runs_per_key IS NOT NULL
           AND (SELECT count(*) FROM runs
                 WHERE tenant = p_tenant AND concurrency_key = p_key
                   AND status IN ('queued', 'running', 'recovering')
                   AND job_published_at IS NOT NULL) >= b.max_runs_per_key)
$$;

CREATE FUNCTION public.outbox_done(p_ids bigint[]) RETURNS void
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
    DELETE FROM outbox
     WHERE id IN (SELECT id FROM outbox WHERE id = ANY(p_ids)
                   ORDER BY run_id, id
                     FOR UPDATE);
$$;

CREATE FUNCTION public.outbox_frame(r public.runs, p_generation integer, p_seq integer, p_type text, p_data jsonb) RETURNS void
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
    INSERT INTO outbox (kind, tenant, run_id, msg_id, body, trace_parent, due_at)
    VALUES ('frame', r.tenant, r.run_id, r.run_id || ':' || p_generation || ':' || p_seq,
            jsonb_build_object('v', 1, 'run_id', r.run_id, 'tenant', r.tenant,
                               'generation', p_generation, 'seq', p_seq,
                               'type', p_type, 'data', p_data,
                               'at', rfc3339(clock_timestamp())),
            coalesce(r.implied_trace_parent, r.trace_parent), now())
$$;

CREATE FUNCTION public.outbox_put(p_kind public.outbox_kind, p_tenant text, p_run_id uuid, p_msg_id text, p_body jsonb, p_trace_parent text, p_due_at timestamp with time zone) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
DECLARE
    v_id bigint := nextval(pg_get_serial_sequence('outbox', 'id'));
BEGIN
    INSERT INTO outbox (id, kind, tenant, run_id, msg_id, body, trace_parent, due_at)
    VALUES (v_id, p_kind, p_tenant, p_run_id,
            coalesce(p_msg_id, p_kind::text || ':' || p_run_id || ':' || v_id),
            p_body, p_trace_parent, p_due_at);
END
$$;

CREATE FUNCTION public.provider_room(p_left integer, p_limit integer, p_seen timestamp with time zone, p_reset timestamp with time zone, p_need integer) RETURNS timestamp with time zone
    LANGUAGE sql STABLE
    AS $$
    SELECT CASE WHEN p_left IS NULL OR p_reset IS NULL OR p_reset <= now()
                     OR p_left >= p_need THEN NULL
                WHEN p_limit IS NULL OR p_limit <= p_left OR p_need > p_limit THEN p_reset
                ELSE p_seen + (p_reset - p_seen) * ((p_need - p_left)::float8 / (p_limit - p_left))
           END
$$;

CREATE FUNCTION public.rate_fit(p_keys text[], p_run uuid, p_tokens integer, OUT o_at timestamp with time zone, OUT o_key text) RETURNS record
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
DECLARE
    l rate_limits;
    v_since timestamp with time zone;
    v_ahead_tokens bigint;
    v_ahead bigint;
    v_at timestamp with time zone;
BEGIN
    o_at := now();
    SELECT since INTO v_since FROM rate_waiters WHERE run_id = p_run;
    FOR l IN SELECT * FROM rate_limits WHERE key = ANY(p_keys) ORDER BY key LOOP
        SELECT coalesce(sum(w.tokens), 0), count(*) INTO v_ahead_tokens, v_ahead
          FROM rate_waiters w JOIN runs r ON r.run_id = w.run_id AND run_active_attempt(r.status)
         WHERE l.key = ANY(w.keys) AND w.run_id <> p_run
           AND (v_since IS NULL OR w.since < v_since);
        v_at := rate_room(l, v_ahead_tokens + p_tokens, v_ahead + 1, p_tokens);
        IF v_at > o_at THEN
            o_at := v_at;
            o_key := l.key;
        END IF;
    END LOOP;
END
$$;

CREATE FUNCTION public.rate_grant(p_keys text[], p_run uuid, p_call text, p_tokens integer) RETURNS void
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
    INSERT INTO rate_grants (key, run_id, call, tokens)
    SELECT key, p_run, p_call, p_tokens FROM rate_limits WHERE key = ANY(p_keys);
    UPDATE rate_limits
       SET tokens_left = CASE WHEN tokens_reset_at > now() THEN tokens_left - p_tokens
                              ELSE tokens_left END,
           requests_left = CASE WHEN requests_reset_at > now() THEN requests_left - 1
                                ELSE requests_left END
     WHERE key = ANY(p_keys);
    DELETE FROM rate_waiters WHERE run_id = p_run;
$$;

CREATE FUNCTION public.rate_granted_run(p_run uuid) RETURNS boolean
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
    SELECT EXISTS (SELECT 1 FROM rate_grants
                    WHERE run_id = p_run AND NOT settled AND at > now() - rate_window())
$$;

CREATE FUNCTION public.rate_observe(p_keys text[], p_said jsonb) RETURNS void
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
    UPDATE rate_limits
       SET blocked_until = greatest(blocked_until, now() + make_interval(
               secs => (p_said->>'retry_after_s')::float8)),
           observed_at = CASE WHEN p_said ? 'tokens_left' OR p_said ? 'requests_left'
                              THEN now() ELSE observed_at END,
           tokens_left = coalesce((p_said->>'tokens_left')::numeric::integer, tokens_left),
           tokens_limit = CASE WHEN p_said ? 'tokens_left'
                               THEN (p_said->>'tokens_limit')::numeric::integer ELSE tokens_limit END,
           tokens_reset_at = CASE WHEN p_said ? 'tokens_left' THEN now() + make_interval(
                                      secs => (p_said->>'tokens_reset_s')::float8)
                                  ELSE tokens_reset_at END,
           requests_left = coalesce((p_said->>'requests_left')::numeric::integer, requests_left),
           requests_limit = CASE WHEN p_said ? 'requests_left'
                                 THEN (p_said->>'requests_limit')::numeric::integer
                                 ELSE requests_limit END,
           requests_reset_at = CASE WHEN p_said ? 'requests_left' THEN now() + make_interval(
                                        secs => (p_said->>'requests_reset_s')::float8)
                                    ELSE requests_reset_at END,
           updated_at = now()
     WHERE key = (SELECT key FROM rate_limits WHERE key = ANY(p_keys)
                   ORDER BY length(key) DESC, key LIMIT 1);
$$;

CREATE FUNCTION public.rate_reserve(p_keys text[], p_run uuid, p_call text, p_tokens integer, p_actor text, OUT o_granted boolean, OUT o_at timestamp with time zone, OUT o_key text, OUT o_limited boolean, OUT o_served integer) RETURNS record
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
DECLARE
    v_keys text[];
BEGIN
    o_served := 0;
    -- One caller at a time per limit: the rows locked in key order.
    SELECT array_agg(key ORDER BY key) INTO v_keys
      FROM (SELECT key FROM rate_limits WHERE key = ANY(p_keys) ORDER BY key FOR UPDATE) l;
    o_granted := true;
    o_limited := v_keys IS NOT NULL;
    IF v_keys IS NULL THEN
        RETURN;
    END IF;
    DELETE FROM rate_grants WHERE key = ANY(v_keys) AND at < now() - 2 * rate_window();
    o_served := rate_serve_waiters(v_keys, p_actor);
    IF EXISTS (SELECT 1 FROM rate_grants
                WHERE run_id = p_run AND call = p_call AND NOT settled
                  AND at > now() - rate_window()) THEN
        -- Made earlier; while the provider asks every call to wait, this one waits too.
        SELECT blocked_until, key INTO o_at, o_key FROM rate_limits
         WHERE key = ANY(v_keys) AND blocked_until > now()
         ORDER BY blocked_until DESC LIMIT 1;
        IF FOUND THEN
            o_granted := false;
            INSERT INTO rate_waiters (run_id, call, keys, tokens)
            VALUES (p_run, p_call, v_keys, p_tokens)
            ON CONFLICT (run_id) DO UPDATE SET call = EXCLUDED.call, keys = EXCLUDED.keys;
            RETURN;
        END IF;
        -- The call is made now: it counts for a minute from now.
        UPDATE rate_grants SET at = now()
         WHERE run_id = p_run AND call = p_call AND NOT settled;
        DELETE FROM rate_waiters WHERE run_id = p_run;
        RETURN;
    END IF;
    SELECT f.o_at, f.o_key INTO o_at, o_key FROM rate_fit(v_keys, p_run, p_tokens) f;
    IF o_at <= now() THEN
        PERFORM rate_grant(v_keys, p_run, p_call, p_tokens);
        o_at := NULL;
        o_key := NULL;
        RETURN;
    END IF;
    o_granted := false;
    IF o_at = 'infinity' THEN
        o_at := NULL;
    ELSE
        INSERT INTO rate_waiters (run_id, call, keys, tokens)
        VALUES (p_run, p_call, v_keys, p_tokens)
        ON CONFLICT (run_id) DO UPDATE
           SET call = EXCLUDED.call, keys = EXCLUDED.keys, tokens = EXCLUDED.tokens;
    END IF;
END
$$;

CREATE TABLE public.rate_limits (
    key text NOT NULL,
    rpm integer,
    tpm integer,
    blocked_until timestamp with time zone,
    observed_at timestamp with time zone,
    tokens_left integer,
    tokens_limit integer,
    tokens_reset_at timestamp with time zone,
    requests_left integer,
    requests_limit integer,
    requests_reset_at timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT rate_limits_key_check CHECK (((length(key) >= 1) AND (length(key) <= 200))),
    CONSTRAINT rate_limits_rpm_check CHECK ((rpm > 0)),
    CONSTRAINT rate_limits_tpm_check CHECK ((tpm > 0))
);

CREATE FUNCTION public.rate_room(l public.rate_limits, p_tokens bigint, p_requests bigint, p_own_tokens integer) RETURNS timestamp with time zone
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
DECLARE
    v_at timestamp with time zone := now();
    v_used bigint;
    v_count bigint;
    v_tokens bigint;
    v_requests bigint;
    g record;
BEGIN
    IF l.tpm IS NOT NULL AND p_own_tokens > l.tpm THEN
        RETURN 'infinity';
    END IF;
    -- What the provider said last.
    IF l.blocked_until > v_at THEN
        v_at := l.blocked_until;
    END IF;
    v_at := greatest(v_at, provider_room(l.tokens_left, l.tokens_limit, l.observed_at,
                                         l.tokens_reset_at, p_own_tokens),
                     provider_room(l.requests_left, l.requests_limit, l.observed_at,
                                   l.requests_reset_at, 1));
    -- The grants of the last minute: enough of them must leave it first.
    SELECT coalesce(sum(tokens), 0), count(*) INTO v_used, v_count
      FROM rate_grants WHERE key = l.key AND at > now() - rate_window();
    v_tokens := CASE WHEN l.tpm IS NULL THEN 0 ELSE v_used + p_tokens - l.tpm END;
    v_requests := CASE WHEN l.rpm IS NULL THEN 0 ELSE v_count + p_requests - l.rpm END;
    IF v_tokens <= 0 AND v_requests <= 0 THEN
        RETURN v_at;
    END IF;
    FOR g IN SELECT tokens, at FROM rate_grants
              WHERE key = l.key AND at > now() - rate_window() ORDER BY at LOOP
        v_tokens := v_tokens - g.tokens;
        v_requests := v_requests - 1;
        IF v_tokens <= 0 AND v_requests <= 0 THEN
            RETURN greatest(v_at, g.at + rate_window());
        END IF;
    END LOOP;
    -- Those waiting ahead need more than the window holds: a window later at least.
    RETURN greatest(v_at, now() + rate_window());
END
$$;

CREATE FUNCTION public.rate_serve_waiters(p_keys text[], p_actor text) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
DECLARE
    v_w rate_waiters;
    v_fit record;
    v_served integer := 0;
BEGIN
    DELETE FROM rate_waiters w WHERE w.keys && p_keys AND NOT EXISTS (
        SELECT 1 FROM runs r WHERE r.run_id = w.run_id AND run_active_attempt(r.status));
    -- Only those whose every limit is among `p_keys` (locked by the caller): a waiter
    -- under a limit not locked here is served by that limit's next caller.
    FOR v_w IN SELECT * FROM rate_waiters WHERE keys <@ p_keys ORDER BY since LOOP
        SELECT * INTO v_fit FROM rate_fit(v_w.keys, v_w.run_id, v_w.tokens);
        EXIT WHEN v_fit.o_at > now();
        PERFORM rate_grant(v_w.keys, v_w.run_id, v_w.call, v_w.tokens);
        WITH upd AS (
            UPDATE runs SET not_before = now(), job_published_at = now(), limit_key = NULL,
                            updated_at = now()
             WHERE run_id = v_w.run_id AND status = 'queued' AND limit_key IS NOT NULL
            RETURNING *
        )
        INSERT INTO run_events (run_id, event, status, attempt, actor, reason)
        SELECT run_id, 'rate_granted', status, attempts, p_actor,
               'room under its rate limits for ' || v_w.call FROM upd;
        v_served := v_served + 1;
    END LOOP;
    RETURN v_served;
END
$$;

CREATE FUNCTION public.rate_settle(p_run uuid, p_call text, p_tokens integer, p_actor text) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
DECLARE
    v_keys text[];
BEGIN
    SELECT array_agg(key ORDER BY key) INTO v_keys FROM rate_grants
     WHERE run_id = p_run AND call = p_call AND NOT settled;
    IF v_keys IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM 1 FROM rate_limits WHERE key = ANY(v_keys) ORDER BY key FOR UPDATE;
    UPDATE rate_grants SET tokens = greatest(p_tokens, 0), settled = true
     WHERE run_id = p_run AND call = p_call AND NOT settled;
    RETURN rate_serve_waiters(v_keys, p_actor);
END
$$;

CREATE FUNCTION public.rate_window() RETURNS interval
    LANGUAGE sql IMMUTABLE
    AS $$ SELECT interval '61 seconds' $$;

CREATE FUNCTION public.resume_run(p_tenant text, p_run_id uuid, p_wait_id text, p_value jsonb, p_request_id text, p_actor text) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
DECLARE
    v_status run_status;
BEGIN
    SELECT status INTO v_status FROM runs
     WHERE run_id = p_run_id AND tenant = p_tenant FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'not_found';
    END IF;
    IF EXISTS (SELECT 1 FROM run_waits WHERE run_id = p_run_id AND request_id = p_request_id)
    THEN
        RETURN 'duplicate';
    END IF;
    IF NOT run_active(v_status) THEN
        RETURN 'not_waiting';
    END IF;
    UPDATE run_waits
       SET outcome = 'answered', value = p_value, request_id = p_request_id, decided_at = now()
     WHERE run_id = p_run_id AND outcome IS NULL AND kind = 'interrupt'
       AND (p_wait_id IS NULL OR wait_id = p_wait_id)
       AND (timeout_at IS NULL OR timeout_at > now());
    IF NOT FOUND THEN
        IF EXISTS (SELECT 1 FROM run_waits
                    WHERE run_id = p_run_id AND outcome IS NULL AND kind = 'interrupt'
                      AND (p_wait_id IS NULL OR wait_id = p_wait_id))
        THEN
            RETURN 'timed_out';
        END IF;
        RETURN 'not_waiting';
    END IF;
    PERFORM wake_run(p_run_id, p_actor, 'answered');
    RETURN 'resumed';
END
$$;

CREATE FUNCTION public.rfc3339(p_at timestamp with time zone) RETURNS text
    LANGUAGE sql STABLE
    AS $$
    SELECT to_char(p_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
$$;

CREATE FUNCTION public.run_active(p_status public.run_status) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT p_status IN ('queued', 'running', 'recovering', 'waiting')
$$;

CREATE FUNCTION public.run_active_attempt(p_status public.run_status) RETURNS boolean
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT p_status IN ('queued', 'running', 'recovering')
$$;

CREATE FUNCTION public.run_authorization(p_tenant text, p_effects text[]) RETURNS text
    LANGUAGE sql STABLE
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
    SELECT md5(coalesce(p_effects::text, '*') || '|' || coalesce(p.effects::text, '*')
               || '|' || coalesce(p.version, 0))
      FROM (SELECT 1) one LEFT JOIN tenant_policies p ON p.tenant = p_tenant
$$;

CREATE FUNCTION public.run_awaits_attempt(p_status public.run_status) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT p_status IN ('queued', 'recovering')
$$;

CREATE FUNCTION public.run_messages() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
DECLARE
    v_generation integer;
    v_seq integer;
    v_done jsonb;
BEGIN
    IF run_awaits_attempt(NEW.status) AND NEW.job_published_at IS NOT NULL
       AND (TG_OP = 'INSERT' OR NEW.job_published_at IS DISTINCT FROM OLD.job_published_at)
    THEN
        PERFORM outbox_put('job', NEW.tenant, NEW.run_id, NULL,
                           jsonb_build_object('v', 1, 'run_id', NEW.run_id,
                                              'tenant', NEW.tenant,
                                              'runner', NEW.runner,
                                              'generation', NEW.generation),
                           coalesce(NEW.implied_trace_parent, NEW.trace_parent),
                           greatest(NEW.not_before, now()));
    END IF;
    IF TG_OP = 'INSERT' OR NEW.status = OLD.status THEN
        RETURN NULL;
    END IF;
    IF NEW.close_seq IS NOT NULL THEN
        v_generation := NEW.generation;
        v_seq := NEW.close_seq;
    ELSE
        v_generation := NEW.generation + 1;
        v_seq := 1;
    END IF;
    IF run_terminal(NEW.status) THEN
        DELETE FROM outbox WHERE run_id = NEW.run_id AND kind = 'job';
        IF NEW.status NOT IN ('finished', 'canceled') AND NEW.error IS NOT NULL THEN
            PERFORM outbox_frame(NEW, v_generation, v_seq, 'error', NEW.error);
            v_seq := v_seq + 1;
        END IF;
        v_done := jsonb_build_object('status', NEW.status);
        IF NEW.status <> 'finished' AND NEW.error ? 'code' THEN
            v_done := v_done || jsonb_build_object('code', NEW.error->'code');
        END IF;
        PERFORM outbox_frame(NEW, v_generation, v_seq, 'done', v_done);
        IF NEW.parent_run_id IS NULL
           AND EXISTS (SELECT 1 FROM webhook_endpoints WHERE tenant = NEW.tenant) THEN
            PERFORM webhook_put(NEW, 'ended');
        END IF;
        IF NEW.session_id IS NOT NULL THEN
            PERFORM start_session_turn(NEW.tenant, NEW.session_id, 'session');
        END IF;
    ELSIF NEW.status = 'queued' AND OLD.status = 'running' AND NEW.close_seq IS NOT NULL
          AND NEW.error IS NOT NULL THEN
        PERFORM outbox_frame(NEW, v_generation, v_seq, 'error', NEW.error);
    END IF;
    IF NEW.status = 'waiting' AND NEW.parent_run_id IS NULL
       AND EXISTS (SELECT 1 FROM webhook_endpoints WHERE tenant = NEW.tenant) THEN
        PERFORM webhook_put(NEW, 'waiting');
    END IF;
    -- A run that stops holding a job (it ended, or waits for an answer) makes room in
    -- its tenant's share: the tenant's next waiting runs get theirs (at once, unless the
    -- statement ending a batch of runs starts its tenants' turns itself, once each:
    -- `share_turns_later`).
    IF NEW.parent_run_id IS NULL AND OLD.job_published_at IS NOT NULL
       AND OLD.status IN ('queued', 'running', 'recovering')
       AND NOT (NEW.status IN ('queued', 'running', 'recovering')
                AND NEW.job_published_at IS NOT NULL)
       AND current_setting('runwire.share_turns_later', true) IS DISTINCT FROM 'on' THEN
        PERFORM start_share_turn(NEW.tenant, 'share');
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION public.run_queued_for(r public.runs) RETURNS text
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
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

CREATE FUNCTION public.run_terminal(p_status public.run_status) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT NOT run_active(p_status)
$$;

CREATE FUNCTION public.session_blocked(p_tenant text, p_session text, p_before bigint) RETURNS boolean
    LANGUAGE sql STABLE
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
    SELECT EXISTS (
        SELECT 1 FROM runs e
         WHERE e.tenant = p_tenant AND e.session_id = p_session
           AND (p_before IS NULL OR e.submit_seq < p_before)
           AND run_active(e.status)
           AND (e.cancel_deadline IS NULL OR e.cancel_deadline > now()))
$$;

CREATE FUNCTION public.set_webhook_endpoints(p_tenant text, p_urls text[], p_events text[]) RETURNS void
    LANGUAGE sql
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
    DELETE FROM webhook_endpoints WHERE tenant = p_tenant AND url <> ALL(p_urls);
    INSERT INTO webhook_endpoints (tenant, url, events)
    SELECT p_tenant, u.url, ARRAY(SELECT jsonb_array_elements_text(u.events::jsonb))
      FROM unnest(p_urls, p_events) AS u(url, events)
    ON CONFLICT (tenant, url) DO UPDATE SET events = EXCLUDED.events;
$$;

CREATE FUNCTION public.signal_run(p_tenant text, p_run_id uuid, p_name text, p_payload jsonb, p_request_id text, p_actor text) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
DECLARE
    v_run runs;
    v_wait text;
BEGIN
    SELECT * INTO v_run FROM runs WHERE run_id = p_run_id AND tenant = p_tenant FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'not_found';
    END IF;
    IF EXISTS (SELECT 1 FROM run_signals WHERE run_id = p_run_id AND request_id = p_request_id)
    THEN
        RETURN 'duplicate';
    END IF;
    IF NOT run_active(v_run.status) THEN
        RETURN 'not_waiting';
    END IF;
    INSERT INTO run_signals (run_id, name, payload, request_id)
    VALUES (p_run_id, p_name, p_payload, p_request_id);
    INSERT INTO run_events (run_id, event, status, attempt, actor, reason)
    VALUES (p_run_id, 'signaled', v_run.status, v_run.attempts, p_actor, p_name);
    UPDATE run_waits
       SET outcome = 'answered', value = p_payload, request_id = p_request_id, decided_at = now()
     WHERE run_id = p_run_id AND outcome IS NULL AND kind = 'signal' AND name = p_name
       AND (timeout_at IS NULL OR timeout_at > now())
    RETURNING wait_id INTO v_wait;
    IF v_wait IS NULL THEN
        RETURN 'kept';
    END IF;
    UPDATE run_signals SET taken_by = v_wait WHERE run_id = p_run_id AND request_id = p_request_id;
    PERFORM wake_run(p_run_id, p_actor, 'signaled');
    RETURN 'delivered';
END
$$;

CREATE FUNCTION public.start_session_turn(p_tenant text, p_session text, p_actor text) RETURNS integer
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
    SELECT issue_turns(p_tenant, p_session, p_actor, 'session_turn',
                       'no earlier run of its session is active')
$$;

CREATE FUNCTION public.start_share_turn(p_tenant text, p_actor text) RETURNS integer
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
    SELECT issue_turns(p_tenant, NULL, p_actor, 'share_turn', 'its tenant''s share has room')
$$;

CREATE FUNCTION public.submit_admits(p_tenant text, p_session text, p_key text, p_not_before timestamp with time zone, p_issued bigint DEFAULT NULL::bigint) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
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

CREATE FUNCTION public.submit_quota_check(p_tenant text) RETURNS boolean
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
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

CREATE FUNCTION public.submit_runs(p_run_ids uuid[], p_tenants text[], p_request_ids text[], p_multitasks text[], p_runners text[], p_inputs text[], p_metadata text[], p_max_attempts integer[], p_attempt_timeouts integer[], p_queue_timeouts integer[], p_actor text, p_trace_parents text[], p_config_pins text[], p_budget_tokens bigint[], p_budget_costs bigint[], p_effects text[], p_workflows text[], p_priorities integer[], p_keys text[], p_not_befores timestamp with time zone[]) RETURNS TABLE(o_run public.runs, o_messages jsonb)
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
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

CREATE FUNCTION public.submitted_reason(r public.runs) RETURNS text
    LANGUAGE sql STABLE
    AS $$
    SELECT 'submit' || CASE run_queued_for(r)
                           WHEN 'time' THEN '; waits for its start time'
                           WHEN 'session' THEN '; waits for its session'
                           WHEN 'concurrency_key' THEN '; waits for its concurrency key'
                           WHEN 'share' THEN '; waits for its tenant''s share'
                           ELSE '' END
$$;

CREATE TABLE public.run_signals (
    run_id uuid NOT NULL,
    seq bigint NOT NULL,
    name text NOT NULL,
    payload jsonb,
    request_id text NOT NULL,
    sent_at timestamp with time zone DEFAULT now() NOT NULL,
    taken_by text
);

CREATE FUNCTION public.take_parent_signal(p_parent uuid, p_run_id uuid, p_wait_id text, p_name text) RETURNS public.run_signals
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
DECLARE
    v_seq bigint;
    v_signal run_signals;
BEGIN
    LOOP
        SELECT seq INTO v_seq FROM run_signals
         WHERE run_id = p_parent AND name = p_name AND taken_by IS NULL
         ORDER BY seq LIMIT 1;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        UPDATE run_signals SET taken_by = p_run_id || '/' || p_wait_id
         WHERE run_id = p_parent AND seq = v_seq AND taken_by IS NULL
        RETURNING * INTO v_signal;
        IF FOUND THEN
            RETURN v_signal;
        END IF;
    END LOOP;
END
$$;

CREATE FUNCTION public.tenant_issued(p_tenant text) RETURNS bigint
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
    SELECT count(*) FROM runs
     WHERE tenant = p_tenant AND status IN ('queued', 'running', 'recovering')
       AND job_published_at IS NOT NULL AND parent_run_id IS NULL
$$;

CREATE FUNCTION public.tenant_share(p_tenant text, OUT o_share integer, OUT o_max_queued integer) RETURNS record
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
    SELECT least(d.share_runs::bigint * coalesce(b.share, 1), 2147483647)::integer,
           coalesce(b.max_queued_runs, d.max_queued_runs)
      FROM queue_defaults d LEFT JOIN tenant_budgets b ON b.tenant = p_tenant
$$;

CREATE FUNCTION public.time_out_waits(p_limit integer, p_actor text) RETURNS SETOF public.runs
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
DECLARE
    v_due record;
BEGIN
    FOR v_due IN
        SELECT w.run_id, w.wait_id FROM run_waits w
         WHERE w.outcome IS NULL AND w.timeout_at <= now()
         ORDER BY w.timeout_at LIMIT p_limit
    LOOP
        PERFORM 1 FROM runs WHERE run_id = v_due.run_id FOR UPDATE;
        UPDATE run_waits
           SET outcome = CASE kind WHEN 'sleep' THEN 'answered' ELSE 'timed_out' END,
               decided_at = now()
         WHERE run_id = v_due.run_id AND wait_id = v_due.wait_id AND outcome IS NULL;
        IF FOUND THEN
            RETURN QUERY SELECT * FROM wake_run(v_due.run_id, p_actor, 'wait timed out');
        END IF;
    END LOOP;
END
$$;

CREATE FUNCTION public.wait_begin(p_run_id uuid, p_generation integer, p_wait_id text, p_kind text, p_name text, p_payload jsonb, p_timeout_ms bigint) RETURNS TABLE(o_state text, o_value jsonb, o_timeout_at timestamp with time zone, o_waited_s double precision)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
DECLARE
    v_wait run_waits;
    v_signal run_signals;
    v_parent uuid;
BEGIN
    SELECT parent_run_id INTO v_parent FROM runs
     WHERE run_id = p_run_id AND generation = p_generation AND status = 'running'
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'lost'::text, NULL::jsonb, NULL::timestamptz, NULL::float8;
        RETURN;
    END IF;
    INSERT INTO run_waits (run_id, wait_id, kind, name, payload, timeout_at)
    VALUES (p_run_id, p_wait_id, p_kind, p_name, p_payload,
            now() + make_interval(secs => p_timeout_ms / 1000.0))
    ON CONFLICT (run_id, wait_id) DO NOTHING;
    SELECT * INTO v_wait FROM run_waits WHERE run_id = p_run_id AND wait_id = p_wait_id;
    IF v_wait.kind <> p_kind OR v_wait.name IS DISTINCT FROM p_name THEN
        RAISE EXCEPTION 'wait % of run % was a % wait, not this one', p_wait_id, p_run_id,
            v_wait.kind USING ERRCODE = 'data_exception';
    END IF;
    IF v_wait.outcome IS NULL AND v_wait.kind = 'signal'
       AND (v_wait.timeout_at IS NULL OR v_wait.timeout_at > now()) THEN
        SELECT * INTO v_signal FROM run_signals
         WHERE run_id = p_run_id AND name = p_name AND taken_by IS NULL
         ORDER BY seq LIMIT 1;
        IF FOUND THEN
            UPDATE run_signals SET taken_by = p_wait_id
             WHERE run_id = p_run_id AND seq = v_signal.seq;
            UPDATE run_waits
               SET outcome = 'answered', value = v_signal.payload,
                   request_id = v_signal.request_id, decided_at = now()
             WHERE run_id = p_run_id AND wait_id = p_wait_id
            RETURNING * INTO v_wait;
        END IF;
    END IF;
    IF v_wait.outcome IS NULL AND v_wait.kind = 'signal' AND v_parent IS NOT NULL THEN
        v_wait := decide_by_parent_signal(v_parent, v_wait);
    END IF;
    IF v_wait.outcome IS NULL AND v_wait.timeout_at <= now() THEN
        -- A sleep's timeout is its end: it is answered by the time.
        UPDATE run_waits
           SET outcome = CASE kind WHEN 'sleep' THEN 'answered' ELSE 'timed_out' END,
               decided_at = now()
         WHERE run_id = p_run_id AND wait_id = p_wait_id
        RETURNING * INTO v_wait;
    END IF;
    IF v_wait.outcome IS NOT NULL AND v_wait.taken_generation IS NULL THEN
        UPDATE run_waits SET taken_generation = p_generation
         WHERE run_id = p_run_id AND wait_id = p_wait_id;
        RETURN QUERY SELECT v_wait.outcome, v_wait.value, v_wait.timeout_at,
                            extract(epoch FROM v_wait.decided_at - v_wait.created_at)::float8;
        RETURN;
    END IF;
    RETURN QUERY SELECT coalesce(v_wait.outcome, 'waiting'), v_wait.value, v_wait.timeout_at,
                        NULL::float8;
END
$$;

CREATE FUNCTION public.wake_run(p_run_id uuid, p_actor text, p_reason text) RETURNS SETOF public.runs
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
DECLARE
    v_run runs;
BEGIN
    UPDATE runs
       SET status = 'queued', not_before = now(), job_published_at = now(),
           close_seq = close_seq - 1, updated_at = now()
     WHERE run_id = p_run_id AND status = 'waiting'
    RETURNING * INTO v_run;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    INSERT INTO run_events (run_id, event, status, attempt, actor, reason)
    VALUES (v_run.run_id, 'resumed', v_run.status, v_run.attempts, p_actor, p_reason);
    RETURN NEXT v_run;
END
$$;

CREATE FUNCTION public.webhook_put(r public.runs, p_event text) RETURNS void
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
    INSERT INTO webhook_deliveries (tenant, url, msg_id, event, body)
    SELECT r.tenant, e.url,
           'msg_' || replace(r.run_id::text, '-', '') || '_' || p_event || '_' || r.generation,
           p_event,
           jsonb_build_object(
               'type', 'run.' || p_event,
               'timestamp', rfc3339(clock_timestamp()),
               'data', jsonb_strip_nulls(jsonb_build_object(
                   'run_id', r.run_id, 'tenant', r.tenant, 'session_id', r.session_id,
                   'runner', r.runner, 'status', r.status, 'attempts', r.attempts,
                   'error', r.error, 'created_at', rfc3339(r.created_at),
                   'ended_at', rfc3339(r.ended_at))))
      FROM webhook_endpoints e
     WHERE e.tenant = r.tenant AND p_event = ANY(e.events)
    ON CONFLICT (url, msg_id) DO NOTHING
$$;

CREATE FUNCTION public.workflow_advance(p_run public.runs, p_actor text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
DECLARE
    v_definition jsonb;
    v_node text;
    v_outputs jsonb;
    v_seq integer;
BEGIN
    SELECT definition INTO v_definition FROM workflow_runs WHERE run_id = p_run.run_id;
    FOR v_node IN
        SELECT n->>'id' FROM jsonb_array_elements(v_definition->'nodes') n
         WHERE NOT EXISTS (  -- not some node's fallback: it runs only in its place
                   SELECT 1 FROM jsonb_array_elements(v_definition->'nodes') f
                    WHERE f->>'fallback' = n->>'id')
           AND NOT EXISTS (SELECT 1 FROM node_runs r
                            WHERE r.run_id = p_run.run_id AND r.node_id = n->>'id')
           AND NOT EXISTS (  -- a predecessor whose slot is not settled
                   SELECT 1 FROM jsonb_array_elements(v_definition->'edges') e
                    WHERE e->>'to' = n->>'id'
                      AND NOT EXISTS (SELECT 1 FROM node_runs s
                                       WHERE s.run_id = p_run.run_id
                                         AND s.slot = e->>'from' AND s.settled))
         ORDER BY n->>'id'
    LOOP
        PERFORM workflow_node_create(p_run, v_definition, v_node, v_node, p_actor);
    END LOOP;
    IF EXISTS (SELECT 1 FROM node_runs
                WHERE run_id = p_run.run_id AND status IN ('ready', 'running', 'waiting')) THEN
        RETURN;
    END IF;
    SELECT jsonb_object_agg(slot, output ORDER BY slot) FILTER (WHERE settled) INTO v_outputs
      FROM node_runs WHERE run_id = p_run.run_id;
    SELECT frame_seq INTO v_seq FROM workflow_runs WHERE run_id = p_run.run_id;
    WITH upd AS (
        UPDATE runs
           SET status = 'finished', result = jsonb_build_object('outputs', coalesce(v_outputs, '{}')),
               close_seq = v_seq + 1, lease_owner = NULL, ended_at = now(), updated_at = now()
         WHERE run_id = p_run.run_id AND status = 'running'
        RETURNING *
    )
    INSERT INTO run_events (run_id, event, status, attempt, actor, reason)
    SELECT run_id, 'finished', status, attempts, p_actor, 'every node ended' FROM upd;
END
$$;

CREATE FUNCTION public.workflow_cancel_runs(p_run_id uuid, p_only uuid, p_error jsonb, p_actor text, p_reason text) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
DECLARE
    v_count integer;
BEGIN
    WITH target AS (
        SELECT run_id FROM runs
         WHERE parent_run_id = p_run_id AND (p_only IS NULL OR run_id = p_only)
           AND run_active(status) AND NOT cancel_requested
           FOR UPDATE SKIP LOCKED
    ), upd AS (
        UPDATE runs c
           SET cancel_requested = true, cancel_error = coalesce(c.cancel_error, p_error),
               cancel_deadline = coalesce(c.cancel_deadline, now()),
               status = CASE WHEN c.status = 'running' THEN c.status ELSE 'canceled'::run_status END,
               error = CASE WHEN c.status = 'running' THEN c.error
                            ELSE coalesce(c.cancel_error, p_error) END,
               ended_at = CASE WHEN c.status = 'running' THEN c.ended_at ELSE now() END,
               close_seq = NULL, updated_at = now()
          FROM target WHERE c.run_id = target.run_id
        RETURNING c.*
    )
    INSERT INTO run_events (run_id, event, status, attempt, actor, code, reason)
    SELECT run_id, 'cancel_requested', status, attempts, p_actor, p_error->>'code', p_reason
      FROM upd;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$$;

CREATE TABLE public.node_runs (
    node_run_id uuid NOT NULL,
    run_id uuid NOT NULL,
    node_id text NOT NULL,
    slot text NOT NULL,
    status public.node_status DEFAULT 'ready'::public.node_status NOT NULL,
    version integer DEFAULT 1 NOT NULL,
    attempt integer DEFAULT 0 NOT NULL,
    settled boolean DEFAULT false NOT NULL,
    deadline_at timestamp with time zone,
    output jsonb,
    error jsonb,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    updated_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    ended_at timestamp with time zone
);

CREATE FUNCTION public.workflow_event(p_run public.runs, p_node public.node_runs, p_event text, p_key text, p_code text, p_reason text, p_actor text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
DECLARE
    v_seq bigint;
    v_at timestamptz;
    v_expected bigint;
BEGIN
    SELECT event_seq INTO v_expected FROM workflow_runs WHERE run_id = p_run.run_id;
    UPDATE workflow_runs
       SET event_seq = event_seq + 1, event_at = greatest(event_at, clock_timestamp())
     WHERE run_id = p_run.run_id AND event_seq = v_expected
    RETURNING event_seq, event_at INTO v_seq, v_at;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'node event of run % out of sequence', p_run.run_id;
    END IF;
    INSERT INTO run_events (run_id, event, status, attempt, actor, code, reason, at,
                            node_id, seq, idempotency_key)
    VALUES (p_run.run_id, p_event, p_run.status, p_node.attempt, p_actor, p_code,
            left(p_reason, 2000), v_at, p_node.node_id, v_seq, p_key)
    ON CONFLICT (run_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING;
    IF NOT FOUND THEN
        -- Used before: give the number back, so that numbers stay consecutive.
        UPDATE workflow_runs SET event_seq = event_seq - 1 WHERE run_id = p_run.run_id;
        RETURN false;
    END IF;
    RETURN true;
END
$$;

CREATE FUNCTION public.workflow_fail(p_run public.runs, p_error jsonb, p_actor text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
DECLARE
    v_seq integer;
BEGIN
    PERFORM workflow_stop_nodes(
        p_run, jsonb_build_object('code', 'CANCELED', 'retryable', false,
                                  'message', 'its workflow run failed'),
        'the workflow run failed', p_actor, false);
    SELECT frame_seq INTO v_seq FROM workflow_runs WHERE run_id = p_run.run_id;
    WITH upd AS (
        UPDATE runs
           SET status = 'failed', error = p_error, close_seq = v_seq + 1, lease_owner = NULL,
               ended_at = now(), updated_at = now()
         WHERE run_id = p_run.run_id AND status = 'running'
        RETURNING *
    )
    INSERT INTO run_events (run_id, event, status, attempt, actor, code, reason)
    SELECT run_id, 'failed', status, attempts, p_actor, p_error->>'code', p_error->>'message'
      FROM upd;
END
$$;

CREATE FUNCTION public.workflow_frame(p_run public.runs, p_type text, p_data jsonb) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
DECLARE
    v_seq integer;
BEGIN
    UPDATE workflow_runs SET frame_seq = frame_seq + 1 WHERE run_id = p_run.run_id
    RETURNING frame_seq INTO v_seq;
    PERFORM outbox_frame(p_run, 1, v_seq, p_type, p_data);
END
$$;

CREATE FUNCTION public.workflow_node(p_definition jsonb, p_node text) RETURNS jsonb
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT n FROM jsonb_array_elements(p_definition->'nodes') n WHERE n->>'id' = p_node
$$;

CREATE FUNCTION public.workflow_node_create(p_run public.runs, p_definition jsonb, p_node text, p_slot text, p_actor text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $_$
DECLARE
    v_spec jsonb := workflow_node(p_definition, p_node);
    v_ctx jsonb;
    v_input jsonb;
    v_id uuid := gen_random_uuid();
    v_node node_runs;
BEGIN
    SELECT jsonb_build_object(
               'input', p_run.input,
               'nodes', coalesce(jsonb_object_agg(slot, coalesce(output, 'null'::jsonb))
                                     FILTER (WHERE settled), '{}'::jsonb))
      INTO v_ctx FROM node_runs WHERE run_id = p_run.run_id;
    v_input := workflow_resolve(coalesce(v_spec->'input', '{"$ref": "input"}'::jsonb), v_ctx);
    IF jsonb_typeof(v_input) <> 'object' THEN
        v_input := jsonb_build_object('value', v_input);
    END IF;
    IF v_spec->>'effect' IS NOT NULL THEN
        v_input := jsonb_build_object('kind', v_spec->>'effect', 'request', v_input);
    ELSIF v_spec->>'signal' IS NOT NULL THEN
        v_input := jsonb_build_object('name', v_spec->>'signal');
    END IF;
    INSERT INTO node_runs (node_run_id, run_id, node_id, slot, deadline_at)
    VALUES (v_id, p_run.run_id, p_node, p_slot,
            clock_timestamp() + make_interval(secs => (v_spec->>'deadline_ms')::bigint / 1000.0))
    ON CONFLICT ON CONSTRAINT node_runs_once DO NOTHING
    RETURNING * INTO v_node;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    INSERT INTO runs (run_id, tenant, request_id, multitask, runner, input, metadata,
                      max_attempts, attempt_timeout_ms, job_published_at, created_at,
                      updated_at, trace_parent, budget_tokens, budget_cost, effects,
                      auth_fence, parent_run_id, node_id, retry_base_ms)
    -- Its request_id comes from its random id: no client's submit can take it first.
    VALUES (v_id, p_run.tenant, 'node:' || v_id, 'enqueue',
            coalesce(v_spec->>'runner',
                     CASE WHEN v_spec->>'signal' IS NOT NULL THEN 'signal' ELSE 'effect' END),
            v_input,
            jsonb_build_object('workflow_run', p_run.run_id, 'node', p_node),
            CASE WHEN v_spec->>'on_failure' = 'fail_run' THEN 1  -- fails the run at once
                 ELSE coalesce((v_spec #>> '{retry,max_attempts}')::integer, 3) END,
            coalesce((v_spec->>'attempt_timeout_ms')::integer, p_run.attempt_timeout_ms),
            now(), clock_timestamp(), clock_timestamp(), p_run.trace_parent,
            p_run.budget_tokens, p_run.budget_cost, p_run.effects, p_run.auth_fence,
            p_run.run_id, p_node, (v_spec #>> '{retry,backoff_ms}')::integer);
    INSERT INTO run_events (run_id, event, status, attempt, actor, reason)
    VALUES (v_id, 'submitted', 'queued', 0, p_actor,
            'node ' || p_node || ' of workflow run ' || p_run.run_id);
    PERFORM workflow_event(p_run, v_node, 'node_ready', 'ready:' || v_id || ':0', NULL,
                           CASE WHEN p_slot = p_node THEN 'every node before it ended'
                                ELSE 'runs in place of ' || p_slot END, p_actor);
END
$_$;

CREATE FUNCTION public.workflow_node_failed(p_run public.runs, p_node public.node_runs, p_status public.node_status, p_error jsonb, p_actor text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
DECLARE
    v_definition jsonb;
    v_spec jsonb;
    v_policy text;
    v_action text := CASE WHEN p_status = 'timed_out' THEN 'timed_out' ELSE 'failed' END;
    v_message text := coalesce(p_error->>'message', 'no reason given');
    v_effect text;
BEGIN
    SELECT definition INTO v_definition FROM workflow_runs WHERE run_id = p_run.run_id;
    v_spec := workflow_node(v_definition, p_node.node_id);
    v_policy := coalesce(v_spec->>'on_failure', 'retry');
    IF v_policy = 'fallback' AND NOT coalesce((v_spec->>'fallback_after_effect')::boolean, false)
    THEN
        -- An effect its run performed, or may have: the fallback would repeat it.
        SELECT key INTO v_effect FROM effects
         WHERE run_id = p_node.node_run_id AND state <> 'prepared'
           AND NOT (state = 'failed' AND error_code IS DISTINCT FROM 'EFFECT_DEADLINE_EXCEEDED')
         ORDER BY created_at, key LIMIT 1;
        IF v_effect IS NOT NULL THEN
            v_policy := 'retry';
            v_message := v_message || '; its fallback ' || (v_spec->>'fallback')
                         || ' does not run: the node performed effect ' || v_effect
                         || ', which it would repeat (fallback_after_effect allows it)';
        END IF;
    END IF;
    IF v_policy = 'skip' THEN
        PERFORM workflow_node_move(
            p_run, p_node, CASE WHEN p_status = 'timed_out' THEN 'timed_out'::node_status
                                ELSE 'skipped'::node_status END,
            CASE WHEN p_status = 'timed_out' THEN 'timed_out' ELSE 'skipped' END,
            p_node.attempt, NULL, p_error, v_message || '; skipped: the nodes after it run',
            NULL, true, p_actor, false);
        PERFORM workflow_advance(p_run, p_actor);
    ELSIF v_policy = 'fallback' THEN
        PERFORM workflow_node_move(
            p_run, p_node, p_status,
            CASE WHEN p_status = 'timed_out' THEN 'timed_out' ELSE 'fell_back' END,
            p_node.attempt, NULL, p_error,
            v_message || '; ' || (v_spec->>'fallback') || ' runs in its place',
            v_spec->>'fallback', false, p_actor, false);
        PERFORM workflow_node_create(p_run, v_definition, v_spec->>'fallback', p_node.slot,
                                     p_actor);
    ELSE
        PERFORM workflow_node_move(p_run, p_node, p_status, v_action, p_node.attempt, NULL,
                                   p_error, v_message, NULL, false, p_actor, false);
        PERFORM workflow_fail(
            p_run,
            jsonb_build_object(
                'code', CASE WHEN p_status = 'timed_out' THEN 'NODE_DEADLINE_EXCEEDED'
                             ELSE 'NODE_FAILED' END,
                'retryable', false,
                'message', 'node ' || p_node.node_id || ' '
                           || CASE WHEN p_status = 'timed_out' THEN 'timed out' ELSE 'failed' END
                           || ': ' || v_message),
            p_actor);
    END IF;
END
$$;

CREATE FUNCTION public.workflow_node_move(p_run public.runs, p_node public.node_runs, p_status public.node_status, p_action text, p_attempt integer, p_output jsonb, p_error jsonb, p_reason text, p_fallback text, p_settled boolean, p_actor text, p_quiet boolean) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
DECLARE
    v_node node_runs;
    v_data jsonb;
    v_generation integer;
BEGIN
    UPDATE node_runs
       SET status = p_status, version = version + 1, attempt = greatest(attempt, p_attempt),
           output = coalesce(p_output, output), error = coalesce(p_error, error),
           settled = p_settled, updated_at = clock_timestamp(),
           ended_at = CASE WHEN p_status IN ('completed', 'failed', 'timed_out', 'skipped')
                           THEN clock_timestamp() END
     WHERE node_run_id = p_node.node_run_id AND version = p_node.version
    RETURNING * INTO v_node;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    -- The key names the attempt by its generation, which only grows (an attempt handed
    -- back at shutdown does not count, so `attempt` may repeat). A key used before keeps
    -- its event.
    SELECT generation INTO v_generation FROM runs WHERE run_id = v_node.node_run_id;
    PERFORM workflow_event(p_run, v_node, 'node_' || p_action,
                           p_action || ':' || v_node.node_run_id || ':'
                               || coalesce(v_generation, 0),
                           p_error->>'code', p_reason, p_actor);
    IF NOT p_quiet THEN
        v_data := jsonb_build_object('node_id', v_node.node_id, 'slot', v_node.slot,
                                     'node_run_id', v_node.node_run_id, 'action', p_action,
                                     'status', p_status, 'attempt', v_node.attempt);
        IF p_reason IS NOT NULL THEN
            v_data := v_data || jsonb_build_object('reason', left(p_reason, 2000));
        END IF;
        IF p_error ? 'code' THEN
            v_data := v_data || jsonb_build_object('code', p_error->>'code');
        END IF;
        IF p_fallback IS NOT NULL THEN
            v_data := v_data || jsonb_build_object('fallback', p_fallback);
        END IF;
        PERFORM workflow_frame(p_run, 'node', v_data);
    END IF;
    RETURN true;
END
$$;

CREATE FUNCTION public.workflow_node_run_changed() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
DECLARE
    v_run runs;
    v_node node_runs;
    v_actor text := coalesce(NEW.lease_owner, 'workflow');
    v_reason text;
BEGIN
    SELECT * INTO v_run FROM runs WHERE run_id = NEW.parent_run_id FOR UPDATE;
    SELECT * INTO v_node FROM node_runs WHERE node_run_id = NEW.run_id;
    IF NOT FOUND OR v_node.status NOT IN ('ready', 'running', 'waiting') THEN
        RETURN NULL;  -- it ended already (timed out, or stopped with its workflow run)
    END IF;
    IF run_terminal(v_run.status) THEN
        PERFORM workflow_node_move(
            v_run, v_node, 'failed', 'failed', NEW.attempts, NULL,
            jsonb_build_object('code', 'CANCELED', 'retryable', false,
                               'message', 'its workflow run ended'),
            'the workflow run ended', NULL, false, v_actor, true);
        RETURN NULL;
    END IF;
    IF NEW.status = 'running' THEN
        PERFORM workflow_node_move(v_run, v_node, 'running', 'started', NEW.attempts, NULL,
                                   NULL, 'attempt ' || NEW.attempts, NULL, false, v_actor,
                                   false);
    ELSIF NEW.status = 'waiting' THEN
        -- Its runner waits (an answer, a signal, a timer): what for, in words.
        SELECT CASE kind WHEN 'interrupt' THEN 'its run asks: ' || left(payload::text, 500)
                         WHEN 'signal' THEN 'its run waits for the signal ' || name
                         ELSE 'its run sleeps until ' || timeout_at END
          INTO v_reason
          FROM run_waits WHERE run_id = NEW.run_id AND outcome IS NULL
         ORDER BY created_at DESC LIMIT 1;
        PERFORM workflow_node_move(v_run, v_node, 'waiting', 'waiting', NEW.attempts, NULL,
                                   NULL, coalesce(v_reason, 'its run waits'), NULL, false,
                                   v_actor, false);
    ELSIF NEW.status = 'queued' AND OLD.status = 'waiting' THEN
        PERFORM workflow_node_move(v_run, v_node, 'ready', 'resumed', NEW.attempts, NULL,
                                   NULL, 'its wait was decided', NULL, false, v_actor, false);
    ELSIF NEW.status = 'queued' THEN
        PERFORM workflow_node_move(v_run, v_node, 'waiting', 'retrying', NEW.attempts, NULL,
                                   NEW.error, coalesce(NEW.error->>'message', 'retrying'),
                                   NULL, false, v_actor, false);
    ELSIF NEW.status = 'recovering' THEN
        PERFORM workflow_node_move(v_run, v_node, 'waiting', 'waiting', NEW.attempts, NULL,
                                   NULL, 'its executor stopped; it resumes elsewhere', NULL,
                                   false, 'recovery', false);
    ELSIF NEW.status = 'finished' THEN
        IF workflow_node_move(v_run, v_node, 'completed', 'completed', NEW.attempts,
                              coalesce(NEW.result, 'null'::jsonb), NULL, NULL, NULL, true,
                              v_actor, false) THEN
            PERFORM workflow_advance(v_run, v_actor);
        END IF;
    ELSE  -- failed, canceled, interrupted
        PERFORM workflow_node_failed(
            v_run, v_node, 'failed',
            coalesce(NEW.error, jsonb_build_object('code', 'RUNNER_ERROR', 'retryable', false,
                                                   'message', 'the node run ' || NEW.status)),
            v_actor);
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION public.workflow_resolve(p_template jsonb, p_ctx jsonb) RETURNS jsonb
    LANGUAGE plpgsql IMMUTABLE
    AS $_$
DECLARE
    v_out jsonb;
BEGIN
    CASE jsonb_typeof(p_template)
    WHEN 'object' THEN
        IF p_template ? '$ref' AND jsonb_typeof(p_template->'$ref') = 'string'
           AND (SELECT count(*) FROM jsonb_object_keys(p_template)) = 1 THEN
            RETURN coalesce(p_ctx #> string_to_array(p_template->>'$ref', '.'), 'null'::jsonb);
        END IF;
        SELECT coalesce(jsonb_object_agg(key, workflow_resolve(value, p_ctx)), '{}'::jsonb)
          INTO v_out FROM jsonb_each(p_template);
        RETURN v_out;
    WHEN 'array' THEN
        SELECT coalesce(jsonb_agg(workflow_resolve(value, p_ctx) ORDER BY ord), '[]'::jsonb)
          INTO v_out FROM jsonb_array_elements(p_template) WITH ORDINALITY AS e(value, ord);
        RETURN v_out;
    ELSE
        RETURN p_template;
    END CASE;
END
$_$;

CREATE FUNCTION public.workflow_run_after() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
DECLARE
    v_definition jsonb;
BEGIN
    IF NEW.status = 'running' AND (TG_OP = 'INSERT' OR OLD.status <> 'running') THEN
        SELECT definition INTO v_definition FROM releases
         WHERE tenant = NEW.tenant AND release_id = NEW.workflow->>'release_id'
           AND version = (NEW.workflow->>'version')::integer;
        INSERT INTO workflow_runs (run_id, definition) VALUES (NEW.run_id, v_definition)
        ON CONFLICT (run_id) DO NOTHING;
        PERFORM workflow_frame(NEW, 'run', jsonb_build_object('attempt', 1, 'resumed', false,
                                                              'partial_length', 0));
        PERFORM workflow_advance(NEW, 'workflow');
    ELSIF TG_OP = 'UPDATE' AND OLD.status = 'running' AND NEW.status = 'canceled' THEN
        PERFORM workflow_stop_nodes(NEW, NEW.error, 'the workflow run was canceled',
                                    'workflow', false);
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION public.workflow_run_before() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
DECLARE
    v_active integer;
    v_seq integer;
BEGIN
    IF NEW.status = 'queued' AND NEW.job_published_at IS NOT NULL AND NOT NEW.cancel_requested
       AND (TG_OP = 'INSERT' OR OLD.job_published_at IS NULL) THEN
        NEW.status := 'running';
        NEW.attempts := 1;
        NEW.generation := 1;
        NEW.started_at := coalesce(NEW.started_at, now());
        NEW.lease_owner := 'workflow';
    ELSIF TG_OP = 'UPDATE' AND OLD.status = 'running' AND NEW.status = 'running'
          AND NEW.cancel_requested AND NOT OLD.cancel_requested THEN
        -- A cancel ends it at once (no executor will): its closing frames follow the
        -- `node` frames of the node runs it stops (workflow_run_after).
        SELECT count(*) INTO v_active FROM node_runs
         WHERE run_id = NEW.run_id AND status IN ('ready', 'running', 'waiting');
        SELECT frame_seq INTO v_seq FROM workflow_runs WHERE run_id = NEW.run_id;
        NEW.status := 'canceled';
        NEW.error := NEW.cancel_error;
        NEW.ended_at := now();
        NEW.lease_owner := NULL;
        NEW.close_seq := coalesce(v_seq, 0) + v_active + 1;
    END IF;
    RETURN NEW;
END
$$;

CREATE FUNCTION public.workflow_stop_nodes(p_run public.runs, p_error jsonb, p_reason text, p_actor text, p_quiet boolean) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
DECLARE
    v_node node_runs;
BEGIN
    FOR v_node IN SELECT * FROM node_runs
                   WHERE run_id = p_run.run_id AND status IN ('ready', 'running', 'waiting')
                   ORDER BY created_at, node_id
    LOOP
        PERFORM workflow_node_move(p_run, v_node, 'failed', 'failed', v_node.attempt, NULL,
                                   p_error, p_reason, NULL, false, p_actor, p_quiet);
    END LOOP;
    PERFORM workflow_cancel_runs(p_run.run_id, NULL, p_error, p_actor, 'its workflow run ended');
END
$$;

CREATE FUNCTION public.workflow_sweep(p_limit integer, OUT timed_out integer, OUT stopped integer) RETURNS record
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
DECLARE
    v_due record;
    v_run runs;
    v_node node_runs;
    v_error jsonb;
BEGIN
    timed_out := 0;
    stopped := 0;
    FOR v_due IN SELECT node_run_id, run_id FROM node_runs
                  WHERE status IN ('ready', 'running', 'waiting') AND deadline_at <= now()
                  ORDER BY deadline_at LIMIT p_limit
    LOOP
        -- The lock order: the node's run, then its workflow run.
        PERFORM 1 FROM runs WHERE run_id = v_due.node_run_id FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        -- Never waits while holding what it took before: a busy workflow run is taken
        -- on a later tick.
        SELECT * INTO v_run FROM runs WHERE run_id = v_due.run_id FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        SELECT * INTO v_node FROM node_runs WHERE node_run_id = v_due.node_run_id;
        CONTINUE WHEN v_node.status NOT IN ('ready', 'running', 'waiting')
                   OR v_node.deadline_at > now() OR run_terminal(v_run.status);
        v_error := jsonb_build_object(
            'code', 'NODE_DEADLINE_EXCEEDED', 'retryable', false,
            'message', 'node ' || v_node.node_id || ' ran past its deadline of '
                       || (workflow_node((SELECT definition FROM workflow_runs
                                           WHERE run_id = v_run.run_id),
                                         v_node.node_id)->>'deadline_ms') || ' ms');
        PERFORM workflow_node_failed(v_run, v_node, 'timed_out', v_error, 'recovery');
        -- Its run stops (the node has ended: the run's own end changes nothing more).
        PERFORM workflow_cancel_runs(v_run.run_id, v_node.node_run_id, v_error, 'recovery',
                                     'its node ran past its deadline');
        timed_out := timed_out + 1;
    END LOOP;
    FOR v_due IN SELECT DISTINCT c.parent_run_id AS run_id FROM runs c JOIN runs p
                     ON p.run_id = c.parent_run_id
                  WHERE c.parent_run_id IS NOT NULL
                    AND c.status IN ('queued', 'running', 'recovering', 'waiting')  -- runs_active_nodes
                    AND NOT c.cancel_requested AND run_terminal(p.status)
                  LIMIT p_limit
    LOOP
        -- Their triggers take the ended workflow run: take it first, without waiting (no
        -- one waits for a node's run while holding its workflow run: SKIP LOCKED).
        PERFORM 1 FROM runs WHERE run_id = v_due.run_id FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        stopped := stopped + workflow_cancel_runs(
            v_due.run_id, NULL,
            jsonb_build_object('code', 'CANCELED', 'retryable', false,
                               'message', 'its workflow run ended'),
            'recovery', 'its workflow run ended');
    END LOOP;
END
$$;

CREATE FUNCTION public.write_segments(p_runs uuid[], p_first bigint[], p_last bigint[], p_last_stream bigint[], p_frames text[], p_closed boolean[]) RETURNS TABLE(run_id uuid, tenant text, last_seq bigint, frame_count bigint, done_written boolean)
    LANGUAGE sql
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
    SELECT 1 FROM runs WHERE runs.run_id = ANY(p_runs) ORDER BY runs.run_id FOR NO KEY UPDATE;

    WITH ins AS (
        INSERT INTO frame_segments (run_id, first_seq, last_seq, last_stream_seq, frames)
        SELECT s.run_id, s.first_seq, s.last_seq, s.last_stream_seq, s.frames::jsonb
          FROM unnest(p_runs, p_first, p_last, p_last_stream, p_frames)
               AS s(run_id, first_seq, last_seq, last_stream_seq, frames)
         -- Segments never overlap, so that frame_count counts each frame once: one that
         -- overlaps a segment already written is left out; what it alone held is
         -- repaired from the stream. Segments are disjoint, so the one starting last at
         -- or before this one's end is the only one that can overlap it.
         WHERE coalesce((SELECT f.last_seq FROM frame_segments f
                          WHERE f.run_id = s.run_id AND f.first_seq <= s.last_seq
                          ORDER BY f.first_seq DESC LIMIT 1), 0) < s.first_seq
        ON CONFLICT ON CONSTRAINT frame_segments_pkey DO NOTHING
        RETURNING frame_segments.run_id, frame_segments.last_seq,
                  jsonb_array_length(frame_segments.frames) AS n
    ), per_run AS (
        SELECT i.run_id, max(i.last_seq) AS last_seq, sum(i.n) AS n, bool_or(u.closed) AS closed
          FROM ins i
          JOIN unnest(p_runs, p_last, p_closed) AS u(run_id, last_seq, closed)
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
    RETURNING r.run_id, r.tenant, r.last_seq, r.frame_count, p.closed;
$$;

CREATE FUNCTION public.xact_messages() RETURNS jsonb
    LANGUAGE sql
    AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'id', o.id, 'kind', o.kind, 'tenant', o.tenant, 'run_id', o.run_id,
               'msg_id', o.msg_id, 'body', o.body::text, 'trace_parent', o.trace_parent,
               'runner', o.body->>'runner') ORDER BY o.id), '[]'::jsonb)
      FROM outbox o
     WHERE o.xact = pg_current_xact_id() AND o.kind <> 'event' AND o.due_at <= o.created_at
$$;

CREATE TABLE public.budget_reservations (
    run_id uuid NOT NULL,
    key text NOT NULL,
    tenant text NOT NULL,
    generation integer NOT NULL,
    tokens bigint NOT NULL,
    used bigint,
    receipt text,
    state text DEFAULT 'reserved'::text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    settled_at timestamp with time zone,
    cost bigint DEFAULT 0 NOT NULL,
    cost_used bigint,
    CONSTRAINT budget_reservations_cost_check CHECK ((cost >= 0)),
    CONSTRAINT budget_reservations_cost_used_check CHECK ((cost_used >= 0)),
    CONSTRAINT budget_reservations_state_check CHECK ((state = ANY (ARRAY['reserved'::text, 'settled'::text, 'released'::text]))),
    CONSTRAINT budget_reservations_tokens_check CHECK ((tokens >= 0)),
    CONSTRAINT budget_reservations_used_check CHECK ((used >= 0))
);

CREATE TABLE public.coalesced_requests (
    tenant text NOT NULL,
    request_id text NOT NULL,
    run_id uuid NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE public.effects (
    run_id uuid NOT NULL,
    key text NOT NULL,
    kind text NOT NULL,
    idempotency_key text NOT NULL,
    request jsonb NOT NULL,
    request_digest text NOT NULL,
    state public.effect_state DEFAULT 'prepared'::public.effect_state NOT NULL,
    version integer DEFAULT 1 NOT NULL,
    fence bigint DEFAULT 0 NOT NULL,
    claimed_generation integer,
    deadline_at timestamp with time zone,
    receipt jsonb,
    error text,
    error_code text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    tokens bigint DEFAULT 0 NOT NULL,
    cost bigint DEFAULT 0 NOT NULL,
    auth_fence text,
    checked_at timestamp with time zone
);

CREATE TABLE public.frame_archive (
    stream text NOT NULL,
    stream_created text NOT NULL,
    archived_through bigint NOT NULL,
    CONSTRAINT frame_archive_archived_through_check CHECK ((archived_through >= 0))
);

CREATE TABLE public.frame_segments (
    run_id uuid NOT NULL,
    first_seq bigint NOT NULL,
    last_seq bigint NOT NULL,
    last_stream_seq bigint NOT NULL,
    frames jsonb NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE public.outbox (
    id bigint NOT NULL,
    kind public.outbox_kind NOT NULL,
    tenant text NOT NULL,
    run_id uuid NOT NULL,
    msg_id text NOT NULL,
    body jsonb NOT NULL,
    trace_parent text,
    xact xid8 DEFAULT pg_current_xact_id() NOT NULL,
    due_at timestamp with time zone DEFAULT now() NOT NULL,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL
);

CREATE SEQUENCE public.outbox_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE public.outbox_id_seq OWNED BY public.outbox.id;

CREATE TABLE public.queue_defaults (
    only_row boolean DEFAULT true NOT NULL,
    share_runs integer NOT NULL,
    max_queued_runs integer NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    priority_max_wait_ms integer DEFAULT 60000 NOT NULL,
    CONSTRAINT queue_defaults_max_queued_runs_check CHECK ((max_queued_runs > 0)),
    CONSTRAINT queue_defaults_only_row_check CHECK (only_row),
    CONSTRAINT queue_defaults_priority_max_wait_ms_check CHECK ((priority_max_wait_ms > 0)),
    CONSTRAINT queue_defaults_share_runs_check CHECK ((share_runs > 0))
);

CREATE TABLE public.rate_grants (
    id bigint NOT NULL,
    key text NOT NULL,
    run_id uuid NOT NULL,
    call text NOT NULL,
    tokens integer NOT NULL,
    settled boolean DEFAULT false NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT rate_grants_tokens_check CHECK ((tokens >= 0))
);

CREATE SEQUENCE public.rate_grants_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE public.rate_grants_id_seq OWNED BY public.rate_grants.id;

CREATE TABLE public.rate_waiters (
    run_id uuid NOT NULL,
    call text NOT NULL,
    keys text[] NOT NULL,
    tokens integer NOT NULL,
    since timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT rate_waiters_tokens_check CHECK ((tokens >= 0))
);

CREATE TABLE public.releases (
    tenant text NOT NULL,
    release_id text NOT NULL,
    version integer NOT NULL,
    definition jsonb NOT NULL,
    digest text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE public.run_events (
    id bigint NOT NULL,
    run_id uuid NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    event text NOT NULL,
    status public.run_status NOT NULL,
    attempt integer NOT NULL,
    actor text NOT NULL,
    code text,
    reason text,
    published_at timestamp with time zone,
    node_id text,
    seq bigint,
    idempotency_key text
);

CREATE SEQUENCE public.run_events_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE public.run_events_id_seq OWNED BY public.run_events.id;

CREATE SEQUENCE public.run_signals_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE public.run_signals_seq_seq OWNED BY public.run_signals.seq;

CREATE TABLE public.runners (
    name text NOT NULL,
    input_schema jsonb,
    registered_by text NOT NULL,
    registered_at timestamp with time zone DEFAULT now() NOT NULL
);

ALTER TABLE public.runs ALTER COLUMN submit_seq ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.runs_submit_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE public.schedules (
    tenant text NOT NULL,
    name text NOT NULL,
    cron text NOT NULL,
    tz text NOT NULL,
    runner text NOT NULL,
    input jsonb NOT NULL,
    overlap text NOT NULL,
    catch_up_s integer NOT NULL,
    paused boolean DEFAULT false NOT NULL,
    max_attempts integer NOT NULL,
    attempt_timeout_ms integer NOT NULL,
    next_fire_at timestamp with time zone NOT NULL,
    last_fire_at timestamp with time zone,
    fired bigint DEFAULT 0 NOT NULL,
    skipped bigint DEFAULT 0 NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT schedules_catch_up_s_check CHECK ((catch_up_s >= 0)),
    CONSTRAINT schedules_overlap_check CHECK ((overlap = ANY (ARRAY['skip'::text, 'buffer'::text, 'allow'::text])))
);

CREATE TABLE public.schema_functions (
    digest text NOT NULL,
    applied_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL
);

CREATE TABLE public.schema_migrations (
    version integer NOT NULL,
    name text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE public.tenant_budgets (
    tenant text NOT NULL,
    tokens bigint,
    max_active_runs integer,
    max_runs_per_day integer,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    cost bigint,
    share integer,
    max_queued_runs integer,
    max_runs_per_key integer,
    CONSTRAINT tenant_budgets_max_queued_runs_check CHECK ((max_queued_runs >= 0)),
    CONSTRAINT tenant_budgets_max_runs_per_key_check CHECK ((max_runs_per_key > 0)),
    CONSTRAINT tenant_budgets_share_check CHECK ((share > 0))
);

CREATE TABLE public.tenant_policies (
    tenant text NOT NULL,
    effects text[],
    version bigint DEFAULT 1 NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE public.tenant_spend (
    tenant text NOT NULL,
    tokens bigint DEFAULT 0 NOT NULL,
    cost bigint DEFAULT 0 NOT NULL
);

CREATE TABLE public.webhook_deliveries (
    id bigint NOT NULL,
    tenant text NOT NULL,
    url text NOT NULL,
    msg_id text NOT NULL,
    event text NOT NULL,
    body jsonb NOT NULL,
    state text DEFAULT 'pending'::text NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    next_at timestamp with time zone DEFAULT now() NOT NULL,
    last_error text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    ended_at timestamp with time zone,
    CONSTRAINT webhook_deliveries_state_check CHECK ((state = ANY (ARRAY['pending'::text, 'delivered'::text, 'failed'::text])))
);

CREATE SEQUENCE public.webhook_deliveries_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE public.webhook_deliveries_id_seq OWNED BY public.webhook_deliveries.id;

CREATE TABLE public.webhook_endpoints (
    tenant text NOT NULL,
    url text NOT NULL,
    events text[] NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE public.webhook_secrets (
    tenant text NOT NULL,
    secret text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE public.workflow_runs (
    run_id uuid NOT NULL,
    definition jsonb NOT NULL,
    frame_seq integer DEFAULT 0 NOT NULL,
    event_seq bigint DEFAULT 0 NOT NULL,
    event_at timestamp with time zone DEFAULT '-infinity'::timestamp with time zone NOT NULL
);

ALTER TABLE ONLY public.outbox ALTER COLUMN id SET DEFAULT nextval('public.outbox_id_seq'::regclass);

ALTER TABLE ONLY public.rate_grants ALTER COLUMN id SET DEFAULT nextval('public.rate_grants_id_seq'::regclass);

ALTER TABLE ONLY public.run_events ALTER COLUMN id SET DEFAULT nextval('public.run_events_id_seq'::regclass);

ALTER TABLE ONLY public.run_signals ALTER COLUMN seq SET DEFAULT nextval('public.run_signals_seq_seq'::regclass);

ALTER TABLE ONLY public.webhook_deliveries ALTER COLUMN id SET DEFAULT nextval('public.webhook_deliveries_id_seq'::regclass);

ALTER TABLE ONLY public.budget_reservations
    ADD CONSTRAINT budget_reservations_pkey PRIMARY KEY (run_id, key);

ALTER TABLE ONLY public.coalesced_requests
    ADD CONSTRAINT coalesced_requests_pkey PRIMARY KEY (tenant, request_id);

ALTER TABLE ONLY public.effects
    ADD CONSTRAINT effects_idempotency_key_key UNIQUE (idempotency_key);

ALTER TABLE ONLY public.effects
    ADD CONSTRAINT effects_pkey PRIMARY KEY (run_id, key);

ALTER TABLE ONLY public.frame_archive
    ADD CONSTRAINT frame_archive_pkey PRIMARY KEY (stream);

ALTER TABLE ONLY public.frame_segments
    ADD CONSTRAINT frame_segments_pkey PRIMARY KEY (run_id, first_seq);

ALTER TABLE ONLY public.node_runs
    ADD CONSTRAINT node_runs_once UNIQUE (run_id, node_id);

ALTER TABLE ONLY public.node_runs
    ADD CONSTRAINT node_runs_pkey PRIMARY KEY (node_run_id);

ALTER TABLE ONLY public.outbox
    ADD CONSTRAINT outbox_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.queue_defaults
    ADD CONSTRAINT queue_defaults_pkey PRIMARY KEY (only_row);

ALTER TABLE ONLY public.rate_grants
    ADD CONSTRAINT rate_grants_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.rate_limits
    ADD CONSTRAINT rate_limits_pkey PRIMARY KEY (key);

ALTER TABLE ONLY public.rate_waiters
    ADD CONSTRAINT rate_waiters_pkey PRIMARY KEY (run_id);

ALTER TABLE ONLY public.releases
    ADD CONSTRAINT releases_pkey PRIMARY KEY (tenant, release_id, version);

ALTER TABLE public.run_events
    ADD CONSTRAINT run_events_event_known CHECK ((event = ANY (ARRAY['submitted'::text, 'claimed'::text, 'finished'::text, 'failed'::text, 'canceled'::text, 'retry'::text, 'released'::text, 'cancel_requested'::text, 'session_turn'::text, 'share_turn'::text, 'rescheduled'::text, 'recovering'::text, 'interrupted'::text, 'rate_limited'::text, 'rate_granted'::text, 'waiting'::text, 'resumed'::text, 'signaled'::text, 'budget_reserved'::text, 'budget_settled'::text, 'budget_released'::text, 'effect_resolved'::text, 'node_ready'::text, 'node_started'::text, 'node_retrying'::text, 'node_waiting'::text, 'node_resumed'::text, 'node_completed'::text, 'node_failed'::text, 'node_fell_back'::text, 'node_skipped'::text, 'node_timed_out'::text]))) NOT VALID;

ALTER TABLE ONLY public.run_events
    ADD CONSTRAINT run_events_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.run_signals
    ADD CONSTRAINT run_signals_pkey PRIMARY KEY (run_id, seq);

ALTER TABLE ONLY public.run_signals
    ADD CONSTRAINT run_signals_run_id_request_id_key UNIQUE (run_id, request_id);

ALTER TABLE ONLY public.run_waits
    ADD CONSTRAINT run_waits_pkey PRIMARY KEY (run_id, wait_id);

ALTER TABLE ONLY public.runners
    ADD CONSTRAINT runners_pkey PRIMARY KEY (name);

ALTER TABLE ONLY public.runs
    ADD CONSTRAINT runs_pkey PRIMARY KEY (run_id);

ALTER TABLE ONLY public.runs
    ADD CONSTRAINT runs_request_unique UNIQUE (tenant, request_id);

ALTER TABLE ONLY public.schedules
    ADD CONSTRAINT schedules_pkey PRIMARY KEY (tenant, name);

ALTER TABLE ONLY public.schema_functions
    ADD CONSTRAINT schema_functions_pkey PRIMARY KEY (digest);

ALTER TABLE ONLY public.schema_migrations
    ADD CONSTRAINT schema_migrations_pkey PRIMARY KEY (version);

ALTER TABLE ONLY public.tenant_budgets
    ADD CONSTRAINT tenant_budgets_pkey PRIMARY KEY (tenant);

ALTER TABLE ONLY public.tenant_policies
    ADD CONSTRAINT tenant_policies_pkey PRIMARY KEY (tenant);

ALTER TABLE ONLY public.tenant_spend
    ADD CONSTRAINT tenant_spend_pkey PRIMARY KEY (tenant);

ALTER TABLE ONLY public.webhook_deliveries
    ADD CONSTRAINT webhook_deliveries_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.webhook_deliveries
    ADD CONSTRAINT webhook_deliveries_url_msg_id_key UNIQUE (url, msg_id);

ALTER TABLE ONLY public.webhook_endpoints
    ADD CONSTRAINT webhook_endpoints_pkey PRIMARY KEY (tenant, url);

ALTER TABLE ONLY public.webhook_secrets
    ADD CONSTRAINT webhook_secrets_pkey PRIMARY KEY (tenant);

ALTER TABLE ONLY public.workflow_runs
    ADD CONSTRAINT workflow_runs_pkey PRIMARY KEY (run_id);

CREATE INDEX budget_reservations_open ON public.budget_reservations USING btree (run_id) WHERE (state = 'reserved'::text);

CREATE INDEX budget_reservations_open_by_tenant ON public.budget_reservations USING btree (tenant) WHERE (state = 'reserved'::text);

CREATE INDEX coalesced_requests_run ON public.coalesced_requests USING btree (run_id);

CREATE INDEX effects_open ON public.effects USING btree (checked_at NULLS FIRST) WHERE (state = ANY (ARRAY['claimed'::public.effect_state, 'unknown'::public.effect_state]));

CREATE INDEX node_runs_deadlines ON public.node_runs USING btree (deadline_at) WHERE ((status = ANY (ARRAY['ready'::public.node_status, 'running'::public.node_status, 'waiting'::public.node_status])) AND (deadline_at IS NOT NULL));

CREATE INDEX outbox_by_due ON public.outbox USING btree (due_at, id);

CREATE INDEX outbox_by_xact ON public.outbox USING btree (xact);

CREATE INDEX outbox_jobs_by_run ON public.outbox USING btree (run_id) WHERE (kind = 'job'::public.outbox_kind);

CREATE INDEX rate_grants_call ON public.rate_grants USING btree (run_id, call) WHERE (NOT settled);

CREATE INDEX rate_grants_window ON public.rate_grants USING btree (key, at);

CREATE INDEX rate_waiters_keys ON public.rate_waiters USING gin (keys);

CREATE INDEX run_events_by_run ON public.run_events USING btree (run_id, id);

CREATE UNIQUE INDEX run_events_once ON public.run_events USING btree (run_id, idempotency_key) WHERE (idempotency_key IS NOT NULL);

CREATE INDEX run_events_unpublished ON public.run_events USING btree (id) WHERE (published_at IS NULL);

CREATE UNIQUE INDEX run_waits_answer ON public.run_waits USING btree (run_id, request_id) WHERE (request_id IS NOT NULL);

CREATE INDEX run_waits_due ON public.run_waits USING btree (timeout_at) WHERE ((outcome IS NULL) AND (timeout_at IS NOT NULL));

CREATE INDEX runs_active_by_status ON public.runs USING btree (status, updated_at) WHERE (status = ANY (ARRAY['queued'::public.run_status, 'running'::public.run_status, 'recovering'::public.run_status, 'waiting'::public.run_status]));

CREATE INDEX runs_active_nodes ON public.runs USING btree (parent_run_id) WHERE ((parent_run_id IS NOT NULL) AND (status = ANY (ARRAY['queued'::public.run_status, 'running'::public.run_status, 'recovering'::public.run_status, 'waiting'::public.run_status])));

CREATE INDEX runs_by_parent ON public.runs USING btree (parent_run_id) WHERE (parent_run_id IS NOT NULL);

CREATE INDEX runs_by_session ON public.runs USING btree (tenant, session_id, created_at) WHERE (session_id IS NOT NULL);

CREATE INDEX runs_by_tenant ON public.runs USING btree (tenant, submit_seq) WHERE (parent_run_id IS NULL);

CREATE INDEX runs_ended_frames ON public.runs USING btree (ended_at) WHERE ((ended_at IS NOT NULL) AND (frames_expired_at IS NULL));

CREATE INDEX runs_issued_by_key ON public.runs USING btree (tenant, concurrency_key) WHERE ((status = ANY (ARRAY['queued'::public.run_status, 'running'::public.run_status, 'recovering'::public.run_status])) AND (job_published_at IS NOT NULL) AND (concurrency_key IS NOT NULL));

CREATE INDEX runs_issued_by_tenant ON public.runs USING btree (tenant) WHERE ((status = ANY (ARRAY['queued'::public.run_status, 'running'::public.run_status, 'recovering'::public.run_status])) AND (job_published_at IS NOT NULL) AND (parent_run_id IS NULL));

CREATE INDEX runs_queued_by_tenant ON public.runs USING btree (tenant, submit_seq) WHERE ((status = 'queued'::public.run_status) AND (parent_run_id IS NULL));

CREATE INDEX runs_session_active ON public.runs USING btree (tenant, session_id, submit_seq) WHERE ((session_id IS NOT NULL) AND (status = ANY (ARRAY['queued'::public.run_status, 'running'::public.run_status, 'recovering'::public.run_status, 'waiting'::public.run_status])));

CREATE INDEX runs_session_waiting ON public.runs USING btree (submit_seq) WHERE ((status = 'queued'::public.run_status) AND (job_published_at IS NULL));

CREATE INDEX runs_unclosed ON public.runs USING btree (ended_at) WHERE ((ended_at IS NOT NULL) AND (NOT frames_closed));

CREATE INDEX runs_unpurged ON public.runs USING btree (ended_at) WHERE ((ended_at IS NOT NULL) AND (stream_purged_at IS NULL));

CREATE INDEX runs_waiting_by_priority ON public.runs USING btree (tenant, priority DESC, submit_seq) WHERE ((status = 'queued'::public.run_status) AND (parent_run_id IS NULL) AND (job_published_at IS NULL));

CREATE INDEX runs_waiting_by_tenant ON public.runs USING btree (tenant, submit_seq) WHERE ((status = 'queued'::public.run_status) AND (parent_run_id IS NULL) AND (job_published_at IS NULL));

CREATE INDEX schedules_due ON public.schedules USING btree (next_fire_at) WHERE (NOT paused);

CREATE INDEX webhook_deliveries_due ON public.webhook_deliveries USING btree (next_at) WHERE (state = 'pending'::text);

CREATE INDEX webhook_deliveries_failed ON public.webhook_deliveries USING btree (tenant, ended_at DESC) WHERE (state = 'failed'::text);

CREATE TRIGGER budget_spend_track AFTER INSERT OR UPDATE ON public.budget_reservations FOR EACH ROW EXECUTE FUNCTION public.budget_spend_track();

CREATE TRIGGER effect_budget_close AFTER UPDATE OF state ON public.effects FOR EACH ROW EXECUTE FUNCTION public.effect_budget_close();

CREATE TRIGGER runs_advance_workflow AFTER INSERT OR UPDATE ON public.runs FOR EACH ROW WHEN ((new.workflow IS NOT NULL)) EXECUTE FUNCTION public.workflow_run_after();

CREATE TRIGGER runs_publish_insert AFTER INSERT ON public.runs FOR EACH ROW EXECUTE FUNCTION public.run_messages();

CREATE TRIGGER runs_publish_update AFTER UPDATE OF status, job_published_at ON public.runs FOR EACH ROW WHEN (((new.status IS DISTINCT FROM old.status) OR (new.job_published_at IS DISTINCT FROM old.job_published_at))) EXECUTE FUNCTION public.run_messages();

CREATE TRIGGER workflow_node_run_changed AFTER UPDATE OF status ON public.runs FOR EACH ROW WHEN (((new.parent_run_id IS NOT NULL) AND (old.status IS DISTINCT FROM new.status))) EXECUTE FUNCTION public.workflow_node_run_changed();

CREATE TRIGGER workflow_run_before BEFORE INSERT OR UPDATE ON public.runs FOR EACH ROW WHEN ((new.workflow IS NOT NULL)) EXECUTE FUNCTION public.workflow_run_before();

ALTER TABLE ONLY public.budget_reservations
    ADD CONSTRAINT budget_reservations_run_id_fkey FOREIGN KEY (run_id) REFERENCES public.runs(run_id) ON DELETE CASCADE;

ALTER TABLE ONLY public.coalesced_requests
    ADD CONSTRAINT coalesced_requests_run_id_fkey FOREIGN KEY (run_id) REFERENCES public.runs(run_id) ON DELETE CASCADE;

ALTER TABLE ONLY public.effects
    ADD CONSTRAINT effects_run_id_fkey FOREIGN KEY (run_id) REFERENCES public.runs(run_id) ON DELETE CASCADE;

ALTER TABLE ONLY public.frame_segments
    ADD CONSTRAINT frame_segments_run_id_fkey FOREIGN KEY (run_id) REFERENCES public.runs(run_id) ON DELETE CASCADE;

ALTER TABLE ONLY public.node_runs
    ADD CONSTRAINT node_runs_run_id_fkey FOREIGN KEY (run_id) REFERENCES public.runs(run_id) ON DELETE CASCADE;

ALTER TABLE ONLY public.run_events
    ADD CONSTRAINT run_events_run_id_fkey FOREIGN KEY (run_id) REFERENCES public.runs(run_id) ON DELETE CASCADE;

ALTER TABLE ONLY public.run_signals
    ADD CONSTRAINT run_signals_run_id_fkey FOREIGN KEY (run_id) REFERENCES public.runs(run_id) ON DELETE CASCADE;

ALTER TABLE ONLY public.run_waits
    ADD CONSTRAINT run_waits_run_id_fkey FOREIGN KEY (run_id) REFERENCES public.runs(run_id) ON DELETE CASCADE;

ALTER TABLE ONLY public.runs
    ADD CONSTRAINT runs_parent_run_id_fkey FOREIGN KEY (parent_run_id) REFERENCES public.runs(run_id) ON DELETE CASCADE;

ALTER TABLE ONLY public.workflow_runs
    ADD CONSTRAINT workflow_runs_run_id_fkey FOREIGN KEY (run_id) REFERENCES public.runs(run_id) ON DELETE CASCADE;

REVOKE ALL ON FUNCTION public.budget_spend_track() FROM PUBLIC;

GRANT SELECT,INSERT,UPDATE ON TABLE public.runs TO runwire_submitter;
GRANT SELECT,UPDATE ON TABLE public.runs TO runwire_executor;
GRANT SELECT,UPDATE ON TABLE public.runs TO runwire_relay;
GRANT SELECT,UPDATE ON TABLE public.runs TO runwire_recovery;

REVOKE ALL ON FUNCTION public.claim_runs(p_runs uuid[], p_generations integer[], p_owner text, p_lease_ms integer, p_job_acks text[], p_presence integer) FROM PUBLIC;
GRANT ALL ON FUNCTION public.claim_runs(p_runs uuid[], p_generations integer[], p_owner text, p_lease_ms integer, p_job_acks text[], p_presence integer) TO runwire_executor;

GRANT SELECT ON TABLE public.run_waits TO runwire_submitter;
GRANT SELECT ON TABLE public.run_waits TO runwire_executor;
GRANT SELECT ON TABLE public.run_waits TO runwire_relay;
GRANT SELECT ON TABLE public.run_waits TO runwire_recovery;

REVOKE ALL ON FUNCTION public.decide_by_parent_signal(p_parent uuid, p_wait public.run_waits) FROM PUBLIC;

REVOKE ALL ON FUNCTION public.deliver_kept_signal(p_tenant text, p_run_id uuid, p_actor text) FROM PUBLIC;
GRANT ALL ON FUNCTION public.deliver_kept_signal(p_tenant text, p_run_id uuid, p_actor text) TO runwire_submitter;

REVOKE ALL ON FUNCTION public.effect_budget_close() FROM PUBLIC;

REVOKE ALL ON FUNCTION public.enter_waiting(p_run_id uuid, p_generation integer, p_wait_id text, p_text text, p_actor text, p_close_seq integer, p_trace_parent text, p_cancel_error jsonb) FROM PUBLIC;
GRANT ALL ON FUNCTION public.enter_waiting(p_run_id uuid, p_generation integer, p_wait_id text, p_text text, p_actor text, p_close_seq integer, p_trace_parent text, p_cancel_error jsonb) TO runwire_executor;

REVOKE ALL ON FUNCTION public.finish_runs(p_runs uuid[], p_generations integer[], p_results text[], p_texts text[], p_actor text, p_close_seqs integer[], p_trace_parents text[]) FROM PUBLIC;
GRANT ALL ON FUNCTION public.finish_runs(p_runs uuid[], p_generations integer[], p_results text[], p_texts text[], p_actor text, p_close_seqs integer[], p_trace_parents text[]) TO runwire_executor;

REVOKE ALL ON FUNCTION public.finish_runs_told(p_runs uuid[], p_generations integer[], p_results text[], p_texts text[], p_actor text, p_close_seqs integer[], p_trace_parents text[]) FROM PUBLIC;
GRANT ALL ON FUNCTION public.finish_runs_told(p_runs uuid[], p_generations integer[], p_results text[], p_texts text[], p_actor text, p_close_seqs integer[], p_trace_parents text[]) TO runwire_executor;

REVOKE ALL ON FUNCTION public.fire_schedule(p_tenant text, p_name text, p_fires timestamp with time zone[], p_next timestamp with time zone, p_skipped integer, p_actor text) FROM PUBLIC;
GRANT ALL ON FUNCTION public.fire_schedule(p_tenant text, p_name text, p_fires timestamp with time zone[], p_next timestamp with time zone, p_skipped integer, p_actor text) TO runwire_recovery;
GRANT ALL ON FUNCTION public.fire_schedule(p_tenant text, p_name text, p_fires timestamp with time zone[], p_next timestamp with time zone, p_skipped integer, p_actor text) TO runwire_submitter;

REVOKE ALL ON FUNCTION public.forget_tenant(p_tenant text) FROM PUBLIC;
GRANT ALL ON FUNCTION public.forget_tenant(p_tenant text) TO runwire_submitter;

REVOKE ALL ON FUNCTION public.insert_runs(p_run_ids uuid[], p_tenants text[], p_request_ids text[], p_multitasks text[], p_runners text[], p_inputs text[], p_metadata text[], p_max_attempts integer[], p_attempt_timeouts integer[], p_queue_timeouts integer[], p_actor text, p_trace_parents text[], p_config_pins text[], p_budget_tokens bigint[], p_budget_costs bigint[], p_effects text[], p_workflows text[], p_priorities integer[], p_keys text[], p_not_befores timestamp with time zone[]) FROM PUBLIC;
GRANT ALL ON FUNCTION public.insert_runs(p_run_ids uuid[], p_tenants text[], p_request_ids text[], p_multitasks text[], p_runners text[], p_inputs text[], p_metadata text[], p_max_attempts integer[], p_attempt_timeouts integer[], p_queue_timeouts integer[], p_actor text, p_trace_parents text[], p_config_pins text[], p_budget_tokens bigint[], p_budget_costs bigint[], p_effects text[], p_workflows text[], p_priorities integer[], p_keys text[], p_not_befores timestamp with time zone[]) TO runwire_submitter;

REVOKE ALL ON FUNCTION public.issue_turns(p_tenant text, p_session text, p_actor text, p_event text, p_reason text) FROM PUBLIC;

REVOKE ALL ON FUNCTION public.outbox_done(p_ids bigint[]) FROM PUBLIC;
GRANT ALL ON FUNCTION public.outbox_done(p_ids bigint[]) TO runwire_submitter;
GRANT ALL ON FUNCTION public.outbox_done(p_ids bigint[]) TO runwire_executor;
GRANT ALL ON FUNCTION public.outbox_done(p_ids bigint[]) TO runwire_relay;
GRANT ALL ON FUNCTION public.outbox_done(p_ids bigint[]) TO runwire_recovery;

REVOKE ALL ON FUNCTION public.outbox_frame(r public.runs, p_generation integer, p_seq integer, p_type text, p_data jsonb) FROM PUBLIC;

REVOKE ALL ON FUNCTION public.outbox_put(p_kind public.outbox_kind, p_tenant text, p_run_id uuid, p_msg_id text, p_body jsonb, p_trace_parent text, p_due_at timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION public.rate_fit(p_keys text[], p_run uuid, p_tokens integer, OUT o_at timestamp with time zone, OUT o_key text) FROM PUBLIC;

REVOKE ALL ON FUNCTION public.rate_grant(p_keys text[], p_run uuid, p_call text, p_tokens integer) FROM PUBLIC;

REVOKE ALL ON FUNCTION public.rate_granted_run(p_run uuid) FROM PUBLIC;
GRANT ALL ON FUNCTION public.rate_granted_run(p_run uuid) TO runwire_executor;

REVOKE ALL ON FUNCTION public.rate_observe(p_keys text[], p_said jsonb) FROM PUBLIC;
GRANT ALL ON FUNCTION public.rate_observe(p_keys text[], p_said jsonb) TO runwire_executor;

REVOKE ALL ON FUNCTION public.rate_reserve(p_keys text[], p_run uuid, p_call text, p_tokens integer, p_actor text, OUT o_granted boolean, OUT o_at timestamp with time zone, OUT o_key text, OUT o_limited boolean, OUT o_served integer) FROM PUBLIC;
GRANT ALL ON FUNCTION public.rate_reserve(p_keys text[], p_run uuid, p_call text, p_tokens integer, p_actor text, OUT o_granted boolean, OUT o_at timestamp with time zone, OUT o_key text, OUT o_limited boolean, OUT o_served integer) TO runwire_executor;

GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.rate_limits TO runwire_submitter;
GRANT SELECT ON TABLE public.rate_limits TO runwire_executor;
GRANT SELECT ON TABLE public.rate_limits TO runwire_recovery;

REVOKE ALL ON FUNCTION public.rate_room(l public.rate_limits, p_tokens bigint, p_requests bigint, p_own_tokens integer) FROM PUBLIC;

REVOKE ALL ON FUNCTION public.rate_serve_waiters(p_keys text[], p_actor text) FROM PUBLIC;

REVOKE ALL ON FUNCTION public.rate_settle(p_run uuid, p_call text, p_tokens integer, p_actor text) FROM PUBLIC;
GRANT ALL ON FUNCTION public.rate_settle(p_run uuid, p_call text, p_tokens integer, p_actor text) TO runwire_executor;

REVOKE ALL ON FUNCTION public.resume_run(p_tenant text, p_run_id uuid, p_wait_id text, p_value jsonb, p_request_id text, p_actor text) FROM PUBLIC;
GRANT ALL ON FUNCTION public.resume_run(p_tenant text, p_run_id uuid, p_wait_id text, p_value jsonb, p_request_id text, p_actor text) TO runwire_submitter;

REVOKE ALL ON FUNCTION public.run_messages() FROM PUBLIC;

GRANT ALL ON FUNCTION public.set_webhook_endpoints(p_tenant text, p_urls text[], p_events text[]) TO runwire_submitter;

REVOKE ALL ON FUNCTION public.signal_run(p_tenant text, p_run_id uuid, p_name text, p_payload jsonb, p_request_id text, p_actor text) FROM PUBLIC;
GRANT ALL ON FUNCTION public.signal_run(p_tenant text, p_run_id uuid, p_name text, p_payload jsonb, p_request_id text, p_actor text) TO runwire_submitter;

REVOKE ALL ON FUNCTION public.start_session_turn(p_tenant text, p_session text, p_actor text) FROM PUBLIC;
GRANT ALL ON FUNCTION public.start_session_turn(p_tenant text, p_session text, p_actor text) TO runwire_recovery;

REVOKE ALL ON FUNCTION public.start_share_turn(p_tenant text, p_actor text) FROM PUBLIC;
GRANT ALL ON FUNCTION public.start_share_turn(p_tenant text, p_actor text) TO runwire_recovery;
GRANT ALL ON FUNCTION public.start_share_turn(p_tenant text, p_actor text) TO runwire_submitter;
GRANT ALL ON FUNCTION public.start_share_turn(p_tenant text, p_actor text) TO runwire_executor;

REVOKE ALL ON FUNCTION public.submit_runs(p_run_ids uuid[], p_tenants text[], p_request_ids text[], p_multitasks text[], p_runners text[], p_inputs text[], p_metadata text[], p_max_attempts integer[], p_attempt_timeouts integer[], p_queue_timeouts integer[], p_actor text, p_trace_parents text[], p_config_pins text[], p_budget_tokens bigint[], p_budget_costs bigint[], p_effects text[], p_workflows text[], p_priorities integer[], p_keys text[], p_not_befores timestamp with time zone[]) FROM PUBLIC;
GRANT ALL ON FUNCTION public.submit_runs(p_run_ids uuid[], p_tenants text[], p_request_ids text[], p_multitasks text[], p_runners text[], p_inputs text[], p_metadata text[], p_max_attempts integer[], p_attempt_timeouts integer[], p_queue_timeouts integer[], p_actor text, p_trace_parents text[], p_config_pins text[], p_budget_tokens bigint[], p_budget_costs bigint[], p_effects text[], p_workflows text[], p_priorities integer[], p_keys text[], p_not_befores timestamp with time zone[]) TO runwire_submitter;

GRANT SELECT ON TABLE public.run_signals TO runwire_submitter;
GRANT SELECT ON TABLE public.run_signals TO runwire_executor;
GRANT SELECT ON TABLE public.run_signals TO runwire_relay;
GRANT SELECT ON TABLE public.run_signals TO runwire_recovery;

REVOKE ALL ON FUNCTION public.take_parent_signal(p_parent uuid, p_run_id uuid, p_wait_id text, p_name text) FROM PUBLIC;

REVOKE ALL ON FUNCTION public.time_out_waits(p_limit integer, p_actor text) FROM PUBLIC;
GRANT ALL ON FUNCTION public.time_out_waits(p_limit integer, p_actor text) TO runwire_recovery;

REVOKE ALL ON FUNCTION public.wait_begin(p_run_id uuid, p_generation integer, p_wait_id text, p_kind text, p_name text, p_payload jsonb, p_timeout_ms bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION public.wait_begin(p_run_id uuid, p_generation integer, p_wait_id text, p_kind text, p_name text, p_payload jsonb, p_timeout_ms bigint) TO runwire_executor;

REVOKE ALL ON FUNCTION public.wake_run(p_run_id uuid, p_actor text, p_reason text) FROM PUBLIC;

REVOKE ALL ON FUNCTION public.webhook_put(r public.runs, p_event text) FROM PUBLIC;

REVOKE ALL ON FUNCTION public.workflow_advance(p_run public.runs, p_actor text) FROM PUBLIC;

REVOKE ALL ON FUNCTION public.workflow_cancel_runs(p_run_id uuid, p_only uuid, p_error jsonb, p_actor text, p_reason text) FROM PUBLIC;

GRANT SELECT ON TABLE public.node_runs TO runwire_submitter;
GRANT SELECT ON TABLE public.node_runs TO runwire_recovery;

REVOKE ALL ON FUNCTION public.workflow_event(p_run public.runs, p_node public.node_runs, p_event text, p_key text, p_code text, p_reason text, p_actor text) FROM PUBLIC;

REVOKE ALL ON FUNCTION public.workflow_fail(p_run public.runs, p_error jsonb, p_actor text) FROM PUBLIC;

REVOKE ALL ON FUNCTION public.workflow_frame(p_run public.runs, p_type text, p_data jsonb) FROM PUBLIC;

REVOKE ALL ON FUNCTION public.workflow_node_create(p_run public.runs, p_definition jsonb, p_node text, p_slot text, p_actor text) FROM PUBLIC;

REVOKE ALL ON FUNCTION public.workflow_node_failed(p_run public.runs, p_node public.node_runs, p_status public.node_status, p_error jsonb, p_actor text) FROM PUBLIC;

REVOKE ALL ON FUNCTION public.workflow_node_move(p_run public.runs, p_node public.node_runs, p_status public.node_status, p_action text, p_attempt integer, p_output jsonb, p_error jsonb, p_reason text, p_fallback text, p_settled boolean, p_actor text, p_quiet boolean) FROM PUBLIC;

REVOKE ALL ON FUNCTION public.workflow_node_run_changed() FROM PUBLIC;

REVOKE ALL ON FUNCTION public.workflow_run_after() FROM PUBLIC;

REVOKE ALL ON FUNCTION public.workflow_run_before() FROM PUBLIC;

REVOKE ALL ON FUNCTION public.workflow_stop_nodes(p_run public.runs, p_error jsonb, p_reason text, p_actor text, p_quiet boolean) FROM PUBLIC;

REVOKE ALL ON FUNCTION public.workflow_sweep(p_limit integer, OUT timed_out integer, OUT stopped integer) FROM PUBLIC;
GRANT ALL ON FUNCTION public.workflow_sweep(p_limit integer, OUT timed_out integer, OUT stopped integer) TO runwire_recovery;

REVOKE ALL ON FUNCTION public.write_segments(p_runs uuid[], p_first bigint[], p_last bigint[], p_last_stream bigint[], p_frames text[], p_closed boolean[]) FROM PUBLIC;
GRANT ALL ON FUNCTION public.write_segments(p_runs uuid[], p_first bigint[], p_last bigint[], p_last_stream bigint[], p_frames text[], p_closed boolean[]) TO runwire_relay;

REVOKE ALL ON FUNCTION public.xact_messages() FROM PUBLIC;
GRANT ALL ON FUNCTION public.xact_messages() TO runwire_submitter;
GRANT ALL ON FUNCTION public.xact_messages() TO runwire_executor;

GRANT SELECT ON TABLE public.budget_reservations TO runwire_submitter;
GRANT SELECT,INSERT,UPDATE ON TABLE public.budget_reservations TO runwire_executor;
GRANT SELECT,UPDATE ON TABLE public.budget_reservations TO runwire_recovery;

GRANT SELECT,INSERT ON TABLE public.coalesced_requests TO runwire_submitter;
GRANT SELECT,DELETE ON TABLE public.coalesced_requests TO runwire_recovery;

GRANT SELECT,UPDATE ON TABLE public.effects TO runwire_submitter;
GRANT SELECT,INSERT,UPDATE ON TABLE public.effects TO runwire_executor;
GRANT SELECT ON TABLE public.effects TO runwire_recovery;

GRANT SELECT,INSERT,UPDATE ON TABLE public.frame_archive TO runwire_relay;

GRANT SELECT ON TABLE public.frame_segments TO runwire_executor;
GRANT SELECT,INSERT ON TABLE public.frame_segments TO runwire_relay;
GRANT SELECT,DELETE ON TABLE public.frame_segments TO runwire_recovery;

GRANT SELECT,DELETE ON TABLE public.outbox TO runwire_submitter;
GRANT SELECT,DELETE ON TABLE public.outbox TO runwire_executor;
GRANT SELECT,DELETE ON TABLE public.outbox TO runwire_relay;
GRANT SELECT,DELETE,UPDATE ON TABLE public.outbox TO runwire_recovery;

GRANT USAGE ON SEQUENCE public.outbox_id_seq TO runwire_submitter;
GRANT USAGE ON SEQUENCE public.outbox_id_seq TO runwire_executor;
GRANT USAGE ON SEQUENCE public.outbox_id_seq TO runwire_relay;
GRANT USAGE ON SEQUENCE public.outbox_id_seq TO runwire_recovery;

GRANT SELECT,INSERT,UPDATE ON TABLE public.queue_defaults TO runwire_submitter;
GRANT SELECT ON TABLE public.queue_defaults TO runwire_executor;
GRANT SELECT ON TABLE public.queue_defaults TO runwire_relay;
GRANT SELECT ON TABLE public.queue_defaults TO runwire_recovery;

GRANT SELECT ON TABLE public.rate_grants TO runwire_submitter;
GRANT SELECT ON TABLE public.rate_grants TO runwire_recovery;

GRANT SELECT ON TABLE public.rate_waiters TO runwire_submitter;
GRANT SELECT ON TABLE public.rate_waiters TO runwire_recovery;

GRANT SELECT,INSERT ON TABLE public.releases TO runwire_submitter;

GRANT SELECT,INSERT ON TABLE public.run_events TO runwire_submitter;
GRANT SELECT,INSERT ON TABLE public.run_events TO runwire_executor;
GRANT SELECT ON TABLE public.run_events TO runwire_relay;
GRANT SELECT,INSERT,UPDATE ON TABLE public.run_events TO runwire_recovery;

GRANT USAGE ON SEQUENCE public.run_events_id_seq TO runwire_submitter;
GRANT USAGE ON SEQUENCE public.run_events_id_seq TO runwire_executor;
GRANT USAGE ON SEQUENCE public.run_events_id_seq TO runwire_relay;
GRANT USAGE ON SEQUENCE public.run_events_id_seq TO runwire_recovery;

GRANT SELECT ON TABLE public.runners TO runwire_submitter;
GRANT SELECT,INSERT,UPDATE ON TABLE public.runners TO runwire_executor;

GRANT USAGE ON SEQUENCE public.runs_submit_seq_seq TO runwire_submitter;
GRANT USAGE ON SEQUENCE public.runs_submit_seq_seq TO runwire_executor;
GRANT USAGE ON SEQUENCE public.runs_submit_seq_seq TO runwire_relay;
GRANT USAGE ON SEQUENCE public.runs_submit_seq_seq TO runwire_recovery;

GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.schedules TO runwire_submitter;
GRANT SELECT,UPDATE ON TABLE public.schedules TO runwire_recovery;

GRANT SELECT ON TABLE public.schema_functions TO runwire_submitter;
GRANT SELECT ON TABLE public.schema_functions TO runwire_executor;
GRANT SELECT ON TABLE public.schema_functions TO runwire_relay;
GRANT SELECT ON TABLE public.schema_functions TO runwire_recovery;

GRANT SELECT ON TABLE public.schema_migrations TO runwire_submitter;
GRANT SELECT ON TABLE public.schema_migrations TO runwire_executor;
GRANT SELECT ON TABLE public.schema_migrations TO runwire_relay;
GRANT SELECT ON TABLE public.schema_migrations TO runwire_recovery;

GRANT SELECT,INSERT,UPDATE ON TABLE public.tenant_budgets TO runwire_submitter;
GRANT SELECT ON TABLE public.tenant_budgets TO runwire_executor;

GRANT SELECT,INSERT,UPDATE ON TABLE public.tenant_policies TO runwire_submitter;
GRANT SELECT ON TABLE public.tenant_policies TO runwire_executor;

GRANT SELECT ON TABLE public.tenant_spend TO runwire_submitter;
GRANT SELECT ON TABLE public.tenant_spend TO runwire_executor;

GRANT SELECT ON TABLE public.webhook_deliveries TO runwire_submitter;
GRANT SELECT,DELETE,UPDATE ON TABLE public.webhook_deliveries TO runwire_recovery;

GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.webhook_endpoints TO runwire_submitter;

GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.webhook_secrets TO runwire_submitter;
GRANT SELECT ON TABLE public.webhook_secrets TO runwire_recovery;

GRANT SELECT ON TABLE public.workflow_runs TO runwire_submitter;
