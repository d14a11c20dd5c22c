-- The sets of run statuses the queries ask about, defined once (RunStatus in contracts
-- is the list; a test checks these agree with RunStatus.terminal). They are inlined by
-- the planner, so a query that uses them still matches the partial indexes that spell
-- the same sets out.

-- Queued, running or recovering: the run holds its session and may still change.
CREATE FUNCTION run_active(p_status run_status) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_status IN ('queued', 'running', 'recovering')
$$;

-- Queued or recovering: the run waits for an attempt.
CREATE FUNCTION run_waiting(p_status run_status) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_status IN ('queued', 'recovering')
$$;

-- Finished, failed, canceled or interrupted: the run never changes again.
CREATE FUNCTION run_terminal(p_status run_status) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT NOT run_active(p_status)
$$;

CREATE OR REPLACE FUNCTION session_blocked(p_tenant text, p_session text, p_before bigint)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (
        SELECT 1 FROM runs e
         WHERE e.tenant = p_tenant AND e.session_id = p_session
           AND (p_before IS NULL OR e.submit_seq < p_before)
           AND run_active(e.status)
           AND (e.cancel_deadline IS NULL OR e.cancel_deadline > now()))
$$;
