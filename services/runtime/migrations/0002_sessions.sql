-- Sessions: the order in which a session's runs were accepted, what a cancel chose (its
-- error, and how long the canceled run may keep holding its session), and the rule that
-- holds a run back while an earlier run of its session is still active.

ALTER TABLE runs
    -- Taken while the submit holds its session's lock, so within a session it follows
    -- the order in which submits were accepted (created_at is the transaction's start).
    ADD COLUMN submit_seq bigint GENERATED ALWAYS AS IDENTITY,
    -- The error a running run is closed with when its executor honours the cancel
    -- (CANCELED for a cancel command, SUPERSEDED for an interrupt).
    ADD COLUMN cancel_error jsonb,
    -- A canceled run that is still running stops holding its session at this time.
    ADD COLUMN cancel_deadline timestamptz;

CREATE INDEX runs_session_active ON runs (tenant, session_id, submit_seq)
    WHERE session_id IS NOT NULL AND status IN ('queued', 'running', 'recovering');

-- Queued runs that have no job yet because their session was busy when they were
-- submitted (job_published_at is NULL only for them).
CREATE INDEX runs_session_waiting ON runs (submit_seq)
    WHERE status = 'queued' AND job_published_at IS NULL;

-- Whether a run of session `p_session` accepted after `p_before` (NULL: a run not yet
-- accepted) must wait: some earlier run of the session is queued, running or recovering,
-- and is not a canceled run past its deadline. The one definition of "the session is
-- busy", used by submit, claim and release alike. A run that is not blocked never becomes
-- blocked again: earlier runs only end, and a deadline only passes.
CREATE FUNCTION session_blocked(p_tenant text, p_session text, p_before bigint)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (
        SELECT 1 FROM runs e
         WHERE e.tenant = p_tenant AND e.session_id = p_session
           AND (p_before IS NULL OR e.submit_seq < p_before)
           AND e.status IN ('queued', 'running', 'recovering')
           AND (e.cancel_deadline IS NULL OR e.cancel_deadline > now()))
$$;
