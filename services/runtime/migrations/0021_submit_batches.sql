-- The submitter inserts the runs submitted at the same moment (outside a session) in one
-- statement and one commit. Each is the `insert_run` statement, run one after the other
-- in the order given, so each sees the ones before it: a tenant's quota counts every
-- run of the batch before it, and a request_id used twice in one batch is inserted once.
-- A quota that refuses one run raises (RWQ01) for the whole batch: the submitter then
-- inserts its runs one by one, so that only the refused run fails. Returns the runs it
-- inserted (a request_id used before inserts nothing).
CREATE FUNCTION insert_runs(p_run_ids uuid[], p_tenants text[], p_request_ids text[],
                            p_multitasks text[], p_runners text[], p_inputs text[],
                            p_metadata text[], p_max_attempts integer[],
                            p_attempt_timeouts integer[], p_queue_timeouts integer[],
                            p_actor text, p_trace_parents text[], p_config_pins text[],
                            p_budget_tokens bigint[], p_budget_costs bigint[],
                            p_effects text[], p_workflows text[])
RETURNS SETOF runs LANGUAGE plpgsql AS $$
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
REVOKE EXECUTE ON FUNCTION insert_runs(uuid[], text[], text[], text[], text[], text[], text[],
                                       integer[], integer[], integer[], text, text[], text[],
                                       bigint[], bigint[], text[], text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION insert_runs(uuid[], text[], text[], text[], text[], text[], text[],
                                      integer[], integer[], integer[], text, text[], text[],
                                      bigint[], bigint[], text[], text[]) TO runwire_submitter;
