-- Budgets: reservations, charges, and the spend they add up to.
-- The current definition of each function and trigger here: edit them in this file, never
-- in a migration (runwire.runtime.store.schema applies the files when they change).

-- What a reservation counts against its budgets: what it holds while reserved, what was
-- used once settled, nothing once released.
CREATE OR REPLACE FUNCTION budget_charge(p_state text, p_held bigint, p_used bigint)
RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE p_state WHEN 'released' THEN 0 WHEN 'settled' THEN coalesce(p_used, 0)
                        ELSE p_held END
$$;

-- Keeps tenant_spend, each tenant's charges added up, in step with its reservations:
-- a reservation's change adds what it changes to the charge.
CREATE OR REPLACE FUNCTION budget_spend_track()
RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path TO 'public', 'pg_temp'
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
REVOKE ALL ON FUNCTION budget_spend_track() FROM PUBLIC;
CREATE OR REPLACE TRIGGER budget_spend_track AFTER INSERT OR UPDATE ON budget_reservations
    FOR EACH ROW EXECUTE FUNCTION budget_spend_track();

-- A workflow run's budgets (`budget_tokens`, `budget_cost`) are shared by its node runs:
-- a reservation of a node run must fit what the workflow run and all its node runs have
-- reserved and spent (under the tenant's lock, as before), not a budget of its own.
CREATE OR REPLACE FUNCTION budget_reserve(p_run uuid, p_key text, p_tokens bigint,
    p_cost bigint, p_generation integer)
RETURNS TABLE(granted boolean, tenant_left bigint, run_left bigint, tenant_cost_left bigint,
    run_cost_left bigint)
LANGUAGE plpgsql AS $$
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

-- An effect's reservation follows the effect: settled at its estimate when the effect
-- happened (or may have), released when it did not. In the same transaction as the
-- effect's move, so no crash leaves one without the other.
CREATE OR REPLACE FUNCTION effect_budget_close()
RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path TO 'public', 'pg_temp'
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
REVOKE ALL ON FUNCTION effect_budget_close() FROM PUBLIC;
CREATE OR REPLACE TRIGGER effect_budget_close AFTER UPDATE OF state ON effects FOR EACH ROW
    EXECUTE FUNCTION effect_budget_close();
