-- Budgets that are never overspent: a tenant's limit (tenant_budgets) and a run's
-- (runs.budget_tokens, set at submit). A runner reserves an estimate before each costly
-- call and settles it with what the call used; a reservation left by an attempt that is
-- gone, or by a run that ended, is released by recovery. Spent = settled use plus what
-- is still reserved; a reservation that does not fit is refused (BUDGET_EXCEEDED).
ALTER TABLE runs ADD COLUMN budget_tokens bigint;

CREATE TABLE tenant_budgets (
    tenant            text PRIMARY KEY,
    tokens            bigint,
    -- Quotas answered at submit (QUOTA_EXCEEDED; nothing created): runs active at once,
    -- and runs submitted per UTC day. NULL: no limit.
    max_active_runs   integer,
    max_runs_per_day  integer,
    updated_at        timestamptz NOT NULL DEFAULT now()
);

-- A submit that a quota of its tenant refuses raises SQLSTATE RWQ01 (the store answers
-- QUOTA_EXCEEDED). Checked under the tenant's lock, so concurrent submits cannot pass a
-- quota together; a tenant with no quota takes no lock.
CREATE FUNCTION submit_quota_check(p_tenant text) RETURNS boolean
LANGUAGE plpgsql AS $$
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
        SELECT count(*) INTO v_count FROM runs WHERE tenant = p_tenant AND run_active(status);
        IF v_count >= v_quota.max_active_runs THEN
            RAISE EXCEPTION 'tenant % has % active runs; its quota is %',
                p_tenant, v_count, v_quota.max_active_runs USING ERRCODE = 'RWQ01';
        END IF;
    END IF;
    IF v_quota.max_runs_per_day IS NOT NULL THEN
        SELECT count(*) INTO v_count FROM runs
         WHERE tenant = p_tenant AND created_at >= date_trunc('day', now() AT TIME ZONE 'UTC')
                                                      AT TIME ZONE 'UTC';
        IF v_count >= v_quota.max_runs_per_day THEN
            RAISE EXCEPTION 'tenant % submitted % runs today (UTC); its quota is %',
                p_tenant, v_count, v_quota.max_runs_per_day USING ERRCODE = 'RWQ01';
        END IF;
    END IF;
    RETURN true;
END
$$;

CREATE TABLE budget_reservations (
    run_id      uuid NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    key         text NOT NULL,
    tenant      text NOT NULL,
    generation  integer NOT NULL,
    tokens      bigint NOT NULL CHECK (tokens >= 0),
    used        bigint CHECK (used >= 0),
    receipt     text,
    state       text NOT NULL DEFAULT 'reserved'
                CHECK (state IN ('reserved', 'settled', 'released')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    settled_at  timestamptz,
    PRIMARY KEY (run_id, key)
);
CREATE INDEX budget_reservations_by_tenant ON budget_reservations (tenant)
    WHERE state <> 'released';
CREATE INDEX budget_reservations_open ON budget_reservations (run_id) WHERE state = 'reserved';

-- What a tenant (or a run) has spent: settled use, plus what is still reserved.
CREATE FUNCTION budget_spent(p_tenant text, p_run uuid) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT coalesce(sum(CASE WHEN state = 'settled' THEN used ELSE tokens END), 0)::bigint
      FROM budget_reservations
     WHERE state <> 'released'
       AND (p_run IS NULL AND tenant = p_tenant OR run_id = p_run)
$$;

-- Reserve `p_tokens` for the run's call `p_key` (the attempt of generation
-- `p_generation` must hold the run): granted when it fits both the tenant's and the
-- run's budget, under the tenant's lock, so concurrent runs cannot overspend together.
-- The same key again returns the reservation already made.
CREATE FUNCTION budget_reserve(p_run uuid, p_key text, p_tokens bigint, p_generation integer)
RETURNS TABLE (granted boolean, tenant_left bigint, run_left bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_run runs;
    v_limit bigint;
    v_tenant_spent bigint;
    v_run_spent bigint;
BEGIN
    SELECT * INTO v_run FROM runs WHERE run_id = p_run;
    IF NOT FOUND OR v_run.generation <> p_generation OR v_run.status <> 'running' THEN
        RETURN;  -- no row: the attempt no longer holds the run
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('runwire.budget'), hashtext(v_run.tenant));
    IF EXISTS (SELECT 1 FROM budget_reservations WHERE run_id = p_run AND key = p_key) THEN
        RETURN QUERY SELECT true, NULL::bigint, NULL::bigint;
        RETURN;
    END IF;
    SELECT tokens INTO v_limit FROM tenant_budgets WHERE tenant = v_run.tenant;
    v_tenant_spent := budget_spent(v_run.tenant, NULL);
    v_run_spent := budget_spent(v_run.tenant, p_run);
    IF (v_limit IS NOT NULL AND v_tenant_spent + p_tokens > v_limit)
       OR (v_run.budget_tokens IS NOT NULL AND v_run_spent + p_tokens > v_run.budget_tokens) THEN
        RETURN QUERY SELECT false, v_limit - v_tenant_spent, v_run.budget_tokens - v_run_spent;
        RETURN;
    END IF;
    INSERT INTO budget_reservations (run_id, key, tenant, generation, tokens)
    VALUES (p_run, p_key, v_run.tenant, p_generation, p_tokens);
    INSERT INTO run_events (run_id, event, status, attempt, actor, reason)
    VALUES (p_run, 'budget_reserved', v_run.status, v_run.attempts,
            coalesce(v_run.lease_owner, 'executor'),
            p_key || ': ' || p_tokens || ' tokens');
    RETURN QUERY SELECT true, v_limit - v_tenant_spent - p_tokens,
                        v_run.budget_tokens - v_run_spent - p_tokens;
END
$$;

-- Every reservation, settlement and release is a run event.
ALTER TABLE run_events DROP CONSTRAINT run_events_event_known;
ALTER TABLE run_events ADD CONSTRAINT run_events_event_known CHECK (event IN (
    'submitted', 'claimed', 'finished', 'failed', 'canceled', 'retry', 'released',
    'cancel_requested', 'session_turn', 'recovering', 'interrupted',
    'budget_reserved', 'budget_settled', 'budget_released')) NOT VALID;
