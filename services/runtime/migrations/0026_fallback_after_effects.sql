-- A workflow node whose run performed a side effect (or may have) does not fall back:
-- the node in its place would perform it again. The node's `fallback_after_effect`
-- lets its fallback run all the same; without it the workflow run fails with
-- NODE_FAILED, saying which effect kept the fallback from running.
CREATE OR REPLACE FUNCTION workflow_node_failed(p_run runs, p_node node_runs, p_status node_status,
                                     p_error jsonb, p_actor text) RETURNS void
LANGUAGE plpgsql AS $$
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

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION workflow_node_failed(runs, node_runs, node_status, jsonb, '
                   'text) SECURITY DEFINER SET search_path = %I, pg_temp', current_schema());
END
$$;
REVOKE EXECUTE ON FUNCTION workflow_node_failed(runs, node_runs, node_status, jsonb, text)
    FROM PUBLIC;
