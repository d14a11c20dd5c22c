-- Cost units beside tokens, costly effects that reserve budget, and the authorization
-- fence of effects.
--
-- Budgets: a tenant and a run may limit cost units (an amount the tenant defines, for
-- example thousandths of a cent) as they limit tokens. A reservation holds both. What a
-- tenant has spent is a counter kept by a trigger (`tenant_spend`), not a sum over every
-- reservation it ever made: a reserve reads one row however long the tenant has run, and
-- deleting old runs gives back nothing they spent.
--
-- Effects: an effect may reserve budget when it is prepared (reservation key
-- `effect:<key>`, made in the same transaction as the effect's row); the reservation is
-- settled at its estimate when the effect commits (or is reconciled, or fails past its
-- deadline: it may have happened), released when it is known not to have happened.
--
-- Authorization: a run may name the effect kinds it is allowed (`runs.effects`; NULL:
-- every kind), and a tenant's policy may limit them too (`tenant_policies`, changed by
-- set_policy, which bumps its version). At submit the run takes a digest of both
-- (`runs.auth_fence`), and each effect keeps it when it is prepared; a claim whose
-- effect's digest no longer matches the current one fails the effect with
-- AUTHORIZATION_STALE.

ALTER TABLE runs ADD COLUMN budget_cost bigint,
                 ADD COLUMN effects text[],
                 ADD COLUMN auth_fence text;
ALTER TABLE tenant_budgets ADD COLUMN cost bigint;
ALTER TABLE budget_reservations ADD COLUMN cost bigint NOT NULL DEFAULT 0 CHECK (cost >= 0),
                                ADD COLUMN cost_used bigint CHECK (cost_used >= 0);
-- An effect keeps the budget it reserved and the authorization it was prepared under.
ALTER TABLE effects ADD COLUMN tokens bigint NOT NULL DEFAULT 0,
                    ADD COLUMN cost bigint NOT NULL DEFAULT 0,
                    ADD COLUMN auth_fence text;
CREATE INDEX budget_reservations_open_by_tenant ON budget_reservations (tenant)
    WHERE state = 'reserved';
DROP INDEX budget_reservations_by_tenant;

-- What a reservation counts against its budgets: what it holds while reserved, what was
-- used once settled, nothing once released.
CREATE FUNCTION budget_charge(p_state text, p_held bigint, p_used bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE p_state WHEN 'released' THEN 0 WHEN 'settled' THEN coalesce(p_used, 0)
                        ELSE p_held END
$$;

CREATE TABLE tenant_spend (
    tenant  text PRIMARY KEY,
    tokens  bigint NOT NULL DEFAULT 0,
    cost    bigint NOT NULL DEFAULT 0
);
INSERT INTO tenant_spend (tenant, tokens, cost)
SELECT tenant, sum(budget_charge(state, tokens, used)), sum(budget_charge(state, cost, cost_used))
  FROM budget_reservations GROUP BY tenant;

CREATE FUNCTION budget_spend_track() RETURNS trigger LANGUAGE plpgsql AS $$
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
CREATE TRIGGER budget_spend_track AFTER INSERT OR UPDATE ON budget_reservations
    FOR EACH ROW EXECUTE FUNCTION budget_spend_track();

DROP FUNCTION budget_reserve(uuid, text, bigint, integer);
DROP FUNCTION budget_spent(text, uuid);

-- Reserve `p_tokens` and `p_cost` for the run's call `p_key` (the attempt of generation
-- `p_generation` must hold the run): granted when both fit the tenant's and the run's
-- budgets, under the tenant's lock, so concurrent runs cannot overspend together. The
-- same key again returns the reservation already made. The *_left columns: what is left
-- of each limit (NULL: no limit).
CREATE FUNCTION budget_reserve(p_run uuid, p_key text, p_tokens bigint, p_cost bigint,
                               p_generation integer)
RETURNS TABLE (granted boolean, tenant_left bigint, run_left bigint,
               tenant_cost_left bigint, run_cost_left bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_run runs;
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
    SELECT * INTO v_limit FROM tenant_budgets WHERE tenant = v_run.tenant;
    SELECT * INTO v_spent FROM tenant_spend WHERE tenant = v_run.tenant;
    SELECT coalesce(sum(budget_charge(state, tokens, used)), 0),
           coalesce(sum(budget_charge(state, cost, cost_used)), 0)
      INTO v_run_tokens, v_run_cost
      FROM budget_reservations WHERE run_id = p_run;
    tenant_left := v_limit.tokens - coalesce(v_spent.tokens, 0);
    run_left := v_run.budget_tokens - v_run_tokens;
    tenant_cost_left := v_limit.cost - coalesce(v_spent.cost, 0);
    run_cost_left := v_run.budget_cost - v_run_cost;
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
CREATE FUNCTION effect_budget_close() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_run runs;
    v_key text := 'effect:' || NEW.key;
    v_row budget_reservations;
BEGIN
    IF NEW.state = OLD.state OR NEW.state NOT IN ('committed', 'reconciled', 'failed') THEN
        RETURN NULL;
    END IF;
    IF NEW.state = 'failed' AND NEW.error_code IS DISTINCT FROM 'EFFECT_DEADLINE_EXCEEDED' THEN
        UPDATE budget_reservations SET state = 'released', settled_at = now()
         WHERE run_id = NEW.run_id AND key = v_key AND state = 'reserved'
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
CREATE TRIGGER effect_budget_close AFTER UPDATE OF state ON effects
    FOR EACH ROW EXECUTE FUNCTION effect_budget_close();

CREATE TABLE tenant_policies (
    tenant      text PRIMARY KEY,
    -- The effect kinds the tenant's runs may perform; NULL: every kind.
    effects     text[],
    version     bigint NOT NULL DEFAULT 1,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- The authorization fence of a run: a digest of its own permissions and of its tenant's
-- policy as it stands now.
CREATE FUNCTION run_authorization(p_tenant text, p_effects text[]) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT md5(coalesce(p_effects::text, '*') || '|' || coalesce(p.effects::text, '*')
               || '|' || coalesce(p.version, 0))
      FROM (SELECT 1) one LEFT JOIN tenant_policies p ON p.tenant = p_tenant
$$;

-- Runs still active and their effects hold the authorization of the policy as it stands
-- (none was set before): an upgrade does not make their effects stale.
UPDATE runs SET auth_fence = run_authorization(tenant, effects) WHERE NOT run_terminal(status);
UPDATE effects e SET auth_fence = r.auth_fence FROM runs r
 WHERE r.run_id = e.run_id AND r.auth_fence IS NOT NULL;

-- An effect resolved by an operator is a run event.
ALTER TABLE run_events DROP CONSTRAINT run_events_event_known;
ALTER TABLE run_events ADD CONSTRAINT run_events_event_known CHECK (event IN (
    'submitted', 'claimed', 'finished', 'failed', 'canceled', 'retry', 'released',
    'cancel_requested', 'session_turn', 'recovering', 'interrupted',
    'budget_reserved', 'budget_settled', 'budget_released', 'effect_resolved')) NOT VALID;
