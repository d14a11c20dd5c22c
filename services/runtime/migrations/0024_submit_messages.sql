-- A submit and a finish learn what their writes imply in the same statement: what the
-- transaction wrote to the outbox that is due at once (a submit's job; a finished run's
-- `done` frame, and the job of the next run of its session). The service publishes those
-- right after the commit without asking Postgres for them again: one round trip less
-- on the way to a run's first frame and to its `done`, one query less per batch.
--
-- `submit_runs` is `insert_runs`, `finish_runs_told` is `finish_runs`; each returns the
-- runs' rows, then one row without a run whose `o_messages` holds the messages in the
-- order they were written (each as `outbox_of_xacts` gives it).

-- The current transaction's outbox rows that are due at once (not run events).
CREATE FUNCTION xact_messages() RETURNS jsonb LANGUAGE sql AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'id', o.id, 'kind', o.kind, 'tenant', o.tenant, 'run_id', o.run_id,
               'msg_id', o.msg_id, 'body', o.body::text, 'trace_parent', o.trace_parent,
               'runner', o.body->>'runner') ORDER BY o.id), '[]'::jsonb)
      FROM outbox o
     WHERE o.xact = pg_current_xact_id() AND o.kind <> 'event' AND o.due_at <= o.created_at
$$;
REVOKE EXECUTE ON FUNCTION xact_messages() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION xact_messages() TO runwire_submitter, runwire_executor;

CREATE FUNCTION submit_runs(p_run_ids uuid[], p_tenants text[], p_request_ids text[],
                            p_multitasks text[], p_runners text[], p_inputs text[],
                            p_metadata text[], p_max_attempts integer[],
                            p_attempt_timeouts integer[], p_queue_timeouts integer[],
                            p_actor text, p_trace_parents text[], p_config_pins text[],
                            p_budget_tokens bigint[], p_budget_costs bigint[],
                            p_effects text[], p_workflows text[])
RETURNS TABLE (o_run runs, o_messages jsonb) LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $$
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
REVOKE EXECUTE ON FUNCTION submit_runs(uuid[], text[], text[], text[], text[], text[], text[],
                                       integer[], integer[], integer[], text, text[], text[],
                                       bigint[], bigint[], text[], text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION submit_runs(uuid[], text[], text[], text[], text[], text[], text[],
                                      integer[], integer[], integer[], text, text[], text[],
                                      bigint[], bigint[], text[], text[]) TO runwire_submitter;

CREATE FUNCTION finish_runs_told(p_runs uuid[], p_generations integer[], p_results text[],
                                 p_texts text[], p_actor text, p_close_seqs integer[],
                                 p_trace_parents text[])
RETURNS TABLE (o_run runs, o_messages jsonb) LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    RETURN QUERY
        SELECT r, NULL::jsonb
          FROM finish_runs(p_runs, p_generations, p_results, p_texts, p_actor, p_close_seqs,
                           p_trace_parents) r;
    RETURN QUERY SELECT NULL::runs, xact_messages();
END
$$;
REVOKE EXECUTE ON FUNCTION finish_runs_told(uuid[], integer[], text[], text[], text, integer[],
                                            text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION finish_runs_told(uuid[], integer[], text[], text[], text, integer[],
                                           text[]) TO runwire_executor;
