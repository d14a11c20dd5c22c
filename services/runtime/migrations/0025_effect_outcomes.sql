-- The effects of runs that ended are settled too, and an operator may correct an effect
-- failed by its deadline.
--
-- An effect left `claimed` or `unknown` by a run that ended (failed, canceled) has no
-- attempt to reconcile it: executors that have its adapter reconcile it instead
-- (`ended_effects`, every RUNWIRE_EFFECT_RECONCILE_MS). `checked_at` spreads that work:
-- each sweep takes the effects checked longest ago.
--
-- An effect failed with EFFECT_DEADLINE_EXCEEDED may have happened, so its reservation
-- was charged; an operator who learns it did not (`resolve_effect` with an error) gets
-- the charge back. Its reservation follows that correction here.
ALTER TABLE effects ADD COLUMN checked_at timestamptz;
CREATE INDEX effects_open ON effects (checked_at NULLS FIRST)
    WHERE state IN ('claimed', 'unknown');

CREATE OR REPLACE FUNCTION effect_budget_close() RETURNS trigger LANGUAGE plpgsql AS $$
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

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION effect_budget_close() SECURITY DEFINER '
                   'SET search_path = %I, pg_temp', current_schema());
END
$$;
REVOKE EXECUTE ON FUNCTION effect_budget_close() FROM PUBLIC;
