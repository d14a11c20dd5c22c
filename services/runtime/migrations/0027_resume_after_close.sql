-- A claim keeps the close point of the attempt before it: how many frames that attempt
-- published, its closing `error` frame included (`close_seq`, NULL when it closed with
-- no frame of its own). The resumed attempt waits for the relay to store them, so that
-- its `run` frame marks its cut (`resume_after`) after that error frame, never before.
ALTER TABLE runs ADD COLUMN prev_close_seq integer;

CREATE OR REPLACE FUNCTION claim_runs(p_runs uuid[], p_generations integer[], p_owner text,
                                      p_lease_ms integer, p_job_acks text[],
                                      p_presence integer)
RETURNS SETOF runs LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $$
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
               prev_close_seq = close_seq, close_seq = NULL,
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
