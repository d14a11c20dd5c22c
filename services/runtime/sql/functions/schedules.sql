-- Schedules: a due schedule's fires become runs, each once.
-- The current definition of each function here: edit them in this file, never in a
-- migration (runwire.runtime.store.schema applies the files when they change).

-- Make a run of schedule `p_name` for each of `p_fires` (request id `schedule:<name>:<fire
-- time>`, so a fire already made makes nothing), by its overlap policy: `allow` runs them
-- side by side; `buffer` queues them one after the other (the schedule's session, runs
-- enqueued); `skip` makes none while a run of the schedule is active. A fire its tenant's
-- queue or quota refuses is skipped. Then the schedule's next fire is `p_next` (NULL:
-- unchanged, a backfill), and its counts grow by what was made and `p_skipped` more
-- (fires past its catch-up window). Returns how many runs were made.
CREATE OR REPLACE FUNCTION fire_schedule(p_tenant text, p_name text,
    p_fires timestamp with time zone[], p_next timestamp with time zone, p_skipped integer,
    p_actor text)
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path TO 'public', 'pg_temp'
SET plan_cache_mode TO 'force_generic_plan' AS $$
DECLARE
    s schedules;
    r runs;
    v_fire timestamp with time zone;
    v_session text;
    v_admit boolean;
    v_made integer := 0;
    v_skipped integer := p_skipped;
BEGIN
    SELECT * INTO s FROM schedules WHERE tenant = p_tenant AND name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    v_session := CASE WHEN s.overlap = 'allow' THEN NULL ELSE 'schedule:' || s.name END;
    FOREACH v_fire IN ARRAY coalesce(p_fires, '{}') LOOP
        IF s.overlap = 'skip' AND session_blocked(p_tenant, v_session, NULL) THEN
            v_skipped := v_skipped + 1;
            CONTINUE;
        END IF;
        BEGIN
            PERFORM submit_quota_check(p_tenant);
            v_admit := submit_admits(p_tenant, v_session, NULL, now());
        EXCEPTION WHEN SQLSTATE 'RWQ01' OR SQLSTATE 'RWQ02' THEN
            v_skipped := v_skipped + 1;
            CONTINUE;
        END;
        INSERT INTO runs (run_id, tenant, request_id, session_id, multitask, runner, input,
                          metadata, max_attempts, attempt_timeout_ms, job_published_at,
                          created_at, updated_at, auth_fence)
        VALUES (gen_random_uuid(), p_tenant, 'schedule:' || s.name || ':' || rfc3339(v_fire),
                v_session, 'enqueue', s.runner, s.input,
                jsonb_build_object('schedule', s.name, 'fire_at', rfc3339(v_fire)),
                s.max_attempts, s.attempt_timeout_ms, CASE WHEN v_admit THEN now() END,
                clock_timestamp(), clock_timestamp(), run_authorization(p_tenant, NULL))
        ON CONFLICT (tenant, request_id) DO NOTHING
        RETURNING * INTO r;
        IF FOUND THEN
            INSERT INTO run_events (run_id, event, status, attempt, actor, reason, at)
            VALUES (r.run_id, 'submitted', r.status, r.attempts, p_actor,
                    'schedule ' || s.name || ', its fire at ' || rfc3339(v_fire), r.created_at);
            v_made := v_made + 1;
        END IF;
    END LOOP;
    UPDATE schedules
       SET next_fire_at = coalesce(p_next, next_fire_at),
           last_fire_at = greatest(last_fire_at, (SELECT max(f) FROM unnest(p_fires) f)),
           fired = fired + v_made, skipped = skipped + v_skipped, updated_at = now()
     WHERE tenant = p_tenant AND name = p_name;
    RETURN v_made;
END
$$;
REVOKE ALL ON FUNCTION fire_schedule(text, text, timestamp with time zone[],
    timestamp with time zone, integer, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fire_schedule(text, text, timestamp with time zone[],
    timestamp with time zone, integer, text) TO runwire_recovery;
GRANT EXECUTE ON FUNCTION fire_schedule(text, text, timestamp with time zone[],
    timestamp with time zone, integer, text) TO runwire_submitter;
