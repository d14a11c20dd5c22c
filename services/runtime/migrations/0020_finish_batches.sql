-- An executor records the runs its attempts finished at the same moment together: one
-- statement and one commit. Each is the `finish_run` statement, run one after the other
-- in the order given (the executor sorts them by run id), with what it implies written
-- by the same triggers. Returns the runs it finished.
CREATE FUNCTION finish_runs(p_runs uuid[], p_generations integer[], p_results text[],
                            p_texts text[], p_actor text, p_close_seqs integer[],
                            p_trace_parents text[])
RETURNS SETOF runs LANGUAGE plpgsql AS $$
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
REVOKE EXECUTE ON FUNCTION finish_runs(uuid[], integer[], text[], text[], text, integer[], text[])
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION finish_runs(uuid[], integer[], text[], text[], text, integer[], text[])
    TO runwire_executor;
