-- Runs that wait: a wait begun by an attempt, the attempt ending to wait, and what
-- decides a wait (an answer, a signal, its timeout), each exactly once.
-- The current definition of each function here: edit them in this file, never in a
-- migration (runwire.runtime.store.schema applies the files when they change).
--
-- Every function that decides a wait locks the run's row first, so a wait is decided by
-- one writer and the run's status read after it: an answer that comes while the attempt
-- is still ending is seen by enter_waiting, which then queues the run at once.
--
-- A wait's timeout_at is its deadline for every one of them: an answer or a signal that
-- comes at or after it does not decide the wait, which is timed out (by recovery's
-- time_out_waits, or by wait_begin when an attempt asks again first). So the winner of an
-- answer racing the timeout is the same whether or not recovery was there to look.

-- A waiting run whose wait was decided: queued for its next attempt, now. The run as
-- written, or no row when it does not wait (its attempt is still ending: enter_waiting
-- queues it; or it ended). A waiting run's close_seq is where frames that close it would
-- go (after its `wait` frame); once queued it is, as after any attempt, how many frames
-- the attempt before published (the next attempt waits for the relay to store them).
CREATE OR REPLACE FUNCTION wake_run(p_run_id uuid, p_actor text, p_reason text)
RETURNS SETOF runs LANGUAGE plpgsql SECURITY DEFINER SET search_path TO 'public', 'pg_temp'
AS $$
DECLARE
    v_run runs;
BEGIN
    UPDATE runs
       SET status = 'queued', not_before = now(), job_published_at = now(),
           close_seq = close_seq - 1, updated_at = now()
     WHERE run_id = p_run_id AND status = 'waiting'
    RETURNING * INTO v_run;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    INSERT INTO run_events (run_id, event, status, attempt, actor, reason)
    VALUES (v_run.run_id, 'resumed', v_run.status, v_run.attempts, p_actor, p_reason);
    RETURN NEXT v_run;
END
$$;
REVOKE ALL ON FUNCTION wake_run(uuid, text, text) FROM PUBLIC;

-- Signals sent to a workflow run are kept in its mailbox for its nodes: the oldest of
-- name `p_name` not taken yet, taken for the wait `p_wait_id` of its node run `p_run_id`
-- (whose row the caller holds), or null. A signal another taker holds is waited for,
-- and passed over once taken.
CREATE OR REPLACE FUNCTION take_parent_signal(p_parent uuid, p_run_id uuid, p_wait_id text,
    p_name text)
RETURNS run_signals LANGUAGE plpgsql SECURITY DEFINER SET search_path TO 'public', 'pg_temp'
AS $$
DECLARE
    v_seq bigint;
    v_signal run_signals;
BEGIN
    LOOP
        SELECT seq INTO v_seq FROM run_signals
         WHERE run_id = p_parent AND name = p_name AND taken_by IS NULL
         ORDER BY seq LIMIT 1;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        UPDATE run_signals SET taken_by = p_run_id || '/' || p_wait_id
         WHERE run_id = p_parent AND seq = v_seq AND taken_by IS NULL
        RETURNING * INTO v_signal;
        IF FOUND THEN
            RETURN v_signal;
        END IF;
    END LOOP;
END
$$;
REVOKE ALL ON FUNCTION take_parent_signal(uuid, uuid, text, text) FROM PUBLIC;

-- The undecided signal wait `p_wait` of a node run (whose row the caller holds) decided
-- by a signal kept for it in its workflow run's mailbox, when there is one: the wait as
-- it is now.
CREATE OR REPLACE FUNCTION decide_by_parent_signal(p_parent uuid, p_wait run_waits)
RETURNS run_waits LANGUAGE plpgsql SECURITY DEFINER SET search_path TO 'public', 'pg_temp'
AS $$
DECLARE
    v_signal run_signals;
    v_wait run_waits := p_wait;
BEGIN
    IF p_wait.timeout_at <= now() THEN
        RETURN v_wait;  -- past its deadline: it times out (see the top of this file)
    END IF;
    v_signal := take_parent_signal(p_parent, p_wait.run_id, p_wait.wait_id, p_wait.name);
    IF v_signal.seq IS NOT NULL THEN
        UPDATE run_waits
           SET outcome = 'answered', value = v_signal.payload,
               request_id = v_signal.request_id, decided_at = now()
         WHERE run_id = p_wait.run_id AND wait_id = p_wait.wait_id AND outcome IS NULL
        RETURNING * INTO v_wait;
    END IF;
    RETURN v_wait;
END
$$;
REVOKE ALL ON FUNCTION decide_by_parent_signal(uuid, run_waits) FROM PUBLIC;

-- The wait `p_wait_id` of the running attempt (`p_generation`) of a run, begun or found:
-- ('answered', value) when an answer, or a signal from the run's mailbox, decided it;
-- ('timed_out', NULL) past its timeout; ('waiting', NULL) when the attempt must end to
-- wait; ('lost', NULL) when the attempt no longer owns the run. A wait begun again by a
-- later attempt (the runner asking the same question after its resume) is found as it
-- was decided. (state, value, timeout_at).
-- `o_waited_s`: how long a decided wait lasted, given to the first attempt that finds
-- it decided (once per wait: its metric's observation), else null.
DROP FUNCTION IF EXISTS wait_begin(uuid, integer, text, text, text, jsonb, bigint);
CREATE OR REPLACE FUNCTION wait_begin(
    p_run_id uuid, p_generation integer, p_wait_id text, p_kind text, p_name text,
    p_payload jsonb, p_timeout_ms bigint
) RETURNS TABLE(o_state text, o_value jsonb, o_timeout_at timestamptz,
                o_waited_s double precision)
LANGUAGE plpgsql SECURITY DEFINER SET search_path TO 'public', 'pg_temp'
AS $$
DECLARE
    v_wait run_waits;
    v_signal run_signals;
    v_parent uuid;
BEGIN
    SELECT parent_run_id INTO v_parent FROM runs
     WHERE run_id = p_run_id AND generation = p_generation AND status = 'running'
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'lost'::text, NULL::jsonb, NULL::timestamptz, NULL::float8;
        RETURN;
    END IF;
    INSERT INTO run_waits (run_id, wait_id, kind, name, payload, timeout_at)
    VALUES (p_run_id, p_wait_id, p_kind, p_name, p_payload,
            now() + make_interval(secs => p_timeout_ms / 1000.0))
    ON CONFLICT (run_id, wait_id) DO NOTHING;
    SELECT * INTO v_wait FROM run_waits WHERE run_id = p_run_id AND wait_id = p_wait_id;
    IF v_wait.kind <> p_kind OR v_wait.name IS DISTINCT FROM p_name THEN
        RAISE EXCEPTION 'wait % of run % was a % wait, not this one', p_wait_id, p_run_id,
            v_wait.kind USING ERRCODE = 'data_exception';
    END IF;
    IF v_wait.outcome IS NULL AND v_wait.kind = 'signal'
       AND (v_wait.timeout_at IS NULL OR v_wait.timeout_at > now()) THEN
        SELECT * INTO v_signal FROM run_signals
         WHERE run_id = p_run_id AND name = p_name AND taken_by IS NULL
         ORDER BY seq LIMIT 1;
        IF FOUND THEN
            UPDATE run_signals SET taken_by = p_wait_id
             WHERE run_id = p_run_id AND seq = v_signal.seq;
            UPDATE run_waits
               SET outcome = 'answered', value = v_signal.payload,
                   request_id = v_signal.request_id, decided_at = now()
             WHERE run_id = p_run_id AND wait_id = p_wait_id
            RETURNING * INTO v_wait;
        END IF;
    END IF;
    IF v_wait.outcome IS NULL AND v_wait.kind = 'signal' AND v_parent IS NOT NULL THEN
        v_wait := decide_by_parent_signal(v_parent, v_wait);
    END IF;
    IF v_wait.outcome IS NULL AND v_wait.timeout_at <= now() THEN
        -- A sleep's timeout is its end: it is answered by the time.
        UPDATE run_waits
           SET outcome = CASE kind WHEN 'sleep' THEN 'answered' ELSE 'timed_out' END,
               decided_at = now()
         WHERE run_id = p_run_id AND wait_id = p_wait_id
        RETURNING * INTO v_wait;
    END IF;
    IF v_wait.outcome IS NOT NULL AND v_wait.taken_generation IS NULL THEN
        UPDATE run_waits SET taken_generation = p_generation
         WHERE run_id = p_run_id AND wait_id = p_wait_id;
        RETURN QUERY SELECT v_wait.outcome, v_wait.value, v_wait.timeout_at,
                            extract(epoch FROM v_wait.decided_at - v_wait.created_at)::float8;
        RETURN;
    END IF;
    RETURN QUERY SELECT coalesce(v_wait.outcome, 'waiting'), v_wait.value, v_wait.timeout_at,
                        NULL::float8;
END
$$;
REVOKE ALL ON FUNCTION wait_begin(uuid, integer, text, text, text, jsonb, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION wait_begin(uuid, integer, text, text, text, jsonb, bigint)
    TO runwire_executor;

-- The attempt (`p_generation`) ends to wait for `p_wait_id`: the run waits, holding no
-- lease and no worker, and the attempt does not count against max_attempts. When the
-- wait was decided meanwhile, the run is queued for its next attempt at once; when a
-- cancel came, it is closed as canceled. No row when the attempt no longer owns the run.
CREATE OR REPLACE FUNCTION enter_waiting(
    p_run_id uuid, p_generation integer, p_wait_id text, p_text text, p_actor text,
    p_close_seq integer, p_trace_parent text, p_cancel_error jsonb
) RETURNS SETOF runs LANGUAGE plpgsql SECURITY DEFINER SET search_path TO 'public', 'pg_temp'
AS $$
DECLARE
    v_run runs;
    v_decided boolean;
    v_parent uuid;
    v_wait run_waits;
BEGIN
    SELECT parent_run_id INTO v_parent FROM runs
     WHERE run_id = p_run_id AND generation = p_generation AND status = 'running'
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT * INTO v_wait FROM run_waits WHERE run_id = p_run_id AND wait_id = p_wait_id;
    -- A node's signal sent to its workflow run since the wait began (see
    -- deliver_kept_signal: one of the two always sees the other).
    IF v_wait.outcome IS NULL AND v_wait.kind = 'signal' AND v_parent IS NOT NULL THEN
        v_wait := decide_by_parent_signal(v_parent, v_wait);
    END IF;
    v_decided := v_wait.outcome IS NOT NULL;
    UPDATE runs
       SET status = CASE WHEN cancel_requested THEN 'canceled'::run_status
                         WHEN v_decided THEN 'queued'::run_status
                         ELSE 'waiting'::run_status END,
           error = CASE WHEN cancel_requested THEN coalesce(cancel_error, p_cancel_error)
                        ELSE error END,
           ended_at = CASE WHEN cancel_requested THEN now() END,
           job_published_at = CASE WHEN v_decided AND NOT cancel_requested THEN now()
                                   ELSE job_published_at END,
           waits = waits + 1, partial_text = p_text, not_before = now(),
           lease_owner = NULL, lease_expires_at = NULL,
           close_seq = CASE WHEN v_decided AND NOT cancel_requested THEN p_close_seq - 1
                            ELSE p_close_seq END,
           implied_trace_parent = p_trace_parent, updated_at = now()
     WHERE run_id = p_run_id
    RETURNING * INTO v_run;
    INSERT INTO run_events (run_id, event, status, attempt, actor, code, reason)
    VALUES (v_run.run_id,
            CASE v_run.status WHEN 'canceled' THEN 'canceled' WHEN 'queued' THEN 'resumed'
                              ELSE 'waiting' END,
            v_run.status, v_run.attempts, p_actor, v_run.error->>'code', p_wait_id);
    RETURN NEXT v_run;
END
$$;
REVOKE ALL ON FUNCTION enter_waiting(uuid, integer, text, text, text, integer, text, jsonb)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION enter_waiting(uuid, integer, text, text, text, integer, text, jsonb)
    TO runwire_executor;

-- An answer to the interrupt run `p_run_id` (of `p_tenant`) waits for (`p_wait_id`, or
-- whichever it waits for): 'resumed' (the run is queued, or will be as its attempt ends),
-- 'duplicate' (this request_id answered before), 'timed_out' (the wait is past its
-- timeout, not yet timed out by recovery: it will be), 'not_waiting', 'not_found'.
CREATE OR REPLACE FUNCTION resume_run(
    p_tenant text, p_run_id uuid, p_wait_id text, p_value jsonb, p_request_id text,
    p_actor text
) RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path TO 'public', 'pg_temp'
AS $$
DECLARE
    v_status run_status;
BEGIN
    SELECT status INTO v_status FROM runs
     WHERE run_id = p_run_id AND tenant = p_tenant FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'not_found';
    END IF;
    IF EXISTS (SELECT 1 FROM run_waits WHERE run_id = p_run_id AND request_id = p_request_id)
    THEN
        RETURN 'duplicate';
    END IF;
    IF NOT run_active(v_status) THEN
        RETURN 'not_waiting';
    END IF;
    UPDATE run_waits
       SET outcome = 'answered', value = p_value, request_id = p_request_id, decided_at = now()
     WHERE run_id = p_run_id AND outcome IS NULL AND kind = 'interrupt'
       AND (p_wait_id IS NULL OR wait_id = p_wait_id)
       AND (timeout_at IS NULL OR timeout_at > now());
    IF NOT FOUND THEN
        IF EXISTS (SELECT 1 FROM run_waits
                    WHERE run_id = p_run_id AND outcome IS NULL AND kind = 'interrupt'
                      AND (p_wait_id IS NULL OR wait_id = p_wait_id))
        THEN
            RETURN 'timed_out';
        END IF;
        RETURN 'not_waiting';
    END IF;
    PERFORM wake_run(p_run_id, p_actor, 'answered');
    RETURN 'resumed';
END
$$;
REVOKE ALL ON FUNCTION resume_run(text, uuid, text, jsonb, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION resume_run(text, uuid, text, jsonb, text, text) TO runwire_submitter;

-- A signal to run `p_run_id` (of `p_tenant`): kept in its mailbox, and taken at once by
-- a wait of the run for that name not past its timeout: 'delivered' (the run is queued,
-- or will be as its attempt ends), 'kept' (until a wait takes it), 'duplicate',
-- 'not_waiting' (the run ended), 'not_found'.
CREATE OR REPLACE FUNCTION signal_run(
    p_tenant text, p_run_id uuid, p_name text, p_payload jsonb, p_request_id text,
    p_actor text
) RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path TO 'public', 'pg_temp'
AS $$
DECLARE
    v_run runs;
    v_wait text;
BEGIN
    SELECT * INTO v_run FROM runs WHERE run_id = p_run_id AND tenant = p_tenant FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'not_found';
    END IF;
    IF EXISTS (SELECT 1 FROM run_signals WHERE run_id = p_run_id AND request_id = p_request_id)
    THEN
        RETURN 'duplicate';
    END IF;
    IF NOT run_active(v_run.status) THEN
        RETURN 'not_waiting';
    END IF;
    INSERT INTO run_signals (run_id, name, payload, request_id)
    VALUES (p_run_id, p_name, p_payload, p_request_id);
    INSERT INTO run_events (run_id, event, status, attempt, actor, reason)
    VALUES (p_run_id, 'signaled', v_run.status, v_run.attempts, p_actor, p_name);
    UPDATE run_waits
       SET outcome = 'answered', value = p_payload, request_id = p_request_id, decided_at = now()
     WHERE run_id = p_run_id AND outcome IS NULL AND kind = 'signal' AND name = p_name
       AND (timeout_at IS NULL OR timeout_at > now())
    RETURNING wait_id INTO v_wait;
    IF v_wait IS NULL THEN
        RETURN 'kept';
    END IF;
    UPDATE run_signals SET taken_by = v_wait WHERE run_id = p_run_id AND request_id = p_request_id;
    PERFORM wake_run(p_run_id, p_actor, 'signaled');
    RETURN 'delivered';
END
$$;
REVOKE ALL ON FUNCTION signal_run(text, uuid, text, jsonb, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION signal_run(text, uuid, text, jsonb, text, text) TO runwire_submitter;

-- A signal kept in the mailbox of workflow run `p_run_id` handed to a node run that
-- waits for it: 'delivered' (that node run is queued, or will be as its attempt ends),
-- 'again' (the one chosen was taken or decided meanwhile: call again), 'none' (no node
-- run waits for a kept signal). The submitter calls it, in a transaction of its own,
-- after each signal to a workflow run: a node run's wait that began before that
-- signal was committed is seen here; one that began after sees the signal itself (in
-- wait_begin or enter_waiting). One node run's row at most is taken, first (the lock
-- order: a node run, then its workflow run).
CREATE OR REPLACE FUNCTION deliver_kept_signal(p_tenant text, p_run_id uuid, p_actor text)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path TO 'public', 'pg_temp'
AS $$
DECLARE
    v_due record;
    v_wait run_waits;
    v_signal run_signals;
BEGIN
    SELECT w.run_id, w.wait_id INTO v_due
      FROM run_signals s
      JOIN runs c ON c.parent_run_id = s.run_id AND run_active(c.status)
      JOIN run_waits w ON w.run_id = c.run_id AND w.outcome IS NULL AND w.kind = 'signal'
                      AND w.name = s.name AND (w.timeout_at IS NULL OR w.timeout_at > now())
     WHERE s.run_id = p_run_id AND s.taken_by IS NULL
       AND EXISTS (SELECT 1 FROM runs p WHERE p.run_id = p_run_id AND p.tenant = p_tenant)
     ORDER BY s.seq, w.created_at LIMIT 1;
    IF NOT FOUND THEN
        RETURN 'none';
    END IF;
    PERFORM 1 FROM runs WHERE run_id = v_due.run_id FOR UPDATE;
    SELECT * INTO v_wait FROM run_waits
     WHERE run_id = v_due.run_id AND wait_id = v_due.wait_id AND outcome IS NULL;
    IF NOT FOUND THEN
        RETURN 'again';
    END IF;
    v_wait := decide_by_parent_signal(p_run_id, v_wait);
    IF v_wait.outcome IS NULL THEN
        RETURN 'again';
    END IF;
    PERFORM wake_run(v_due.run_id, p_actor, 'signaled');
    RETURN 'delivered';
END
$$;
REVOKE ALL ON FUNCTION deliver_kept_signal(text, uuid, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION deliver_kept_signal(text, uuid, text) TO runwire_submitter;

-- Waits past their timeout, up to `p_limit`, decided 'timed_out' (a sleep's: 'answered',
-- its time has come); the waiting runs among theirs queued for their next attempt
-- (which sees the outcome), returned as written.
CREATE OR REPLACE FUNCTION time_out_waits(p_limit integer, p_actor text)
RETURNS SETOF runs LANGUAGE plpgsql SECURITY DEFINER SET search_path TO 'public', 'pg_temp'
AS $$
DECLARE
    v_due record;
BEGIN
    FOR v_due IN
        SELECT w.run_id, w.wait_id FROM run_waits w
         WHERE w.outcome IS NULL AND w.timeout_at <= now()
         ORDER BY w.timeout_at LIMIT p_limit
    LOOP
        PERFORM 1 FROM runs WHERE run_id = v_due.run_id FOR UPDATE;
        UPDATE run_waits
           SET outcome = CASE kind WHEN 'sleep' THEN 'answered' ELSE 'timed_out' END,
               decided_at = now()
         WHERE run_id = v_due.run_id AND wait_id = v_due.wait_id AND outcome IS NULL;
        IF FOUND THEN
            RETURN QUERY SELECT * FROM wake_run(v_due.run_id, p_actor, 'wait timed out');
        END IF;
    END LOOP;
END
$$;
REVOKE ALL ON FUNCTION time_out_waits(integer, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION time_out_waits(integer, text) TO runwire_recovery;
