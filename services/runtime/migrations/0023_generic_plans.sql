-- The statements inside the functions that every run goes through (submit, claim,
-- finish, its closing frames, its segments) reach a few rows by key: one plan fits
-- every call. Left to itself (plan_cache_mode = auto), Postgres plans such a statement
-- again on each of its first five calls in a connection, and goes on doing so for as
-- long as the generic plan does not look cheaper than the custom ones, which for these
-- it rarely does. Planning cost more than running: session_blocked, asked by every
-- claim, took 170 µs a call planned each time and 20 µs with its generic plan;
-- write_segments 670 against 330 µs. These functions keep one plan per connection.
-- (Only functions Postgres never inlines into the statement that calls them: a
-- setting of its own would stop that.)
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure
          FROM pg_proc p
         WHERE p.pronamespace = current_schema()::regnamespace
           AND p.proname IN ('insert_runs', 'submit_quota_check', 'session_blocked',
                             'claim_runs', 'finish_runs', 'run_messages', 'outbox_put',
                             'outbox_frame', 'outbox_done', 'write_segments',
                             'release_session_turn', 'run_authorization')
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET plan_cache_mode = force_generic_plan', f);
    END LOOP;
END
$$;
