-- An executor claims the jobs it fetched together: the claims of one batch are one
-- statement and one commit. Each claim is the `claim_run` statement, run one after the
-- other in the order given (the executor sorts them by run id, the order every
-- statement that writes several runs takes), so each sees the ones before it: two runs
-- of one session are never both started. Returns the runs it claimed.
CREATE FUNCTION claim_runs(p_runs uuid[], p_generations integer[], p_owner text,
                           p_lease_ms integer, p_job_acks text[], p_presence integer)
RETURNS SETOF runs LANGUAGE plpgsql AS $$
DECLARE
    i integer;
    r runs;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_runs, 1), 0) LOOP
        UPDATE runs
           SET status = 'running', attempts = attempts + 1, generation = generation + 1,
               lease_owner = p_owner,
               lease_expires_at = now() + make_interval(secs => p_lease_ms / 1000.0),
               job_ack = p_job_acks[i], lease_presence = p_presence, close_seq = NULL,
               started_at = coalesce(started_at, now()), updated_at = now()
         WHERE run_id = p_runs[i] AND generation = p_generations[i] AND run_waiting(status)
           AND NOT cancel_requested AND not_before <= now()
           AND (attempts > 0 OR queue_timeout_ms IS NULL
                OR created_at + make_interval(secs => queue_timeout_ms / 1000.0) > now())
           AND NOT session_blocked(tenant, session_id, submit_seq)
        RETURNING * INTO r;
        IF FOUND THEN
            INSERT INTO run_events (run_id, event, status, attempt, actor, reason)
            VALUES (r.run_id, 'claimed', r.status, r.attempts, p_owner, 'attempt started');
            RETURN NEXT r;
        END IF;
    END LOOP;
END
$$;
REVOKE EXECUTE ON FUNCTION claim_runs(uuid[], integer[], text, integer, text[], integer)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION claim_runs(uuid[], integer[], text, integer, text[], integer)
    TO runwire_executor;
