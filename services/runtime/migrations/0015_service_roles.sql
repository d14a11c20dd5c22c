-- Least privilege in Postgres: a role per service, with only the tables and statements
-- that service uses. Migrations run as the owner of the schema (who must be able to
-- create roles, or find these four created by an administrator:
-- `CREATE ROLE runwire_submitter NOLOGIN;` and so on); each service connects as a login
-- role that is, or is a member of, its own (`CREATE ROLE rw_exec LOGIN PASSWORD '...' IN
-- ROLE runwire_executor;`).
--
-- What a transition implies is written by triggers and helpers that run with the rights
-- of their owner (SECURITY DEFINER, with the search path of this migration): the outbox,
-- the counters of what tenants spent, an effect's reservation, the next run of a session.
-- So a service needs no right on the outbox to write it, and none on tables it only
-- touches through them.
DO $$
DECLARE
    v_role text;
BEGIN
    FOREACH v_role IN ARRAY ARRAY['runwire_submitter', 'runwire_executor', 'runwire_relay',
                                  'runwire_recovery'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = v_role) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', v_role);
            EXCEPTION
                WHEN duplicate_object OR unique_violation THEN
                    NULL;  -- created meanwhile by a migration of another database
                WHEN insufficient_privilege THEN
                    RAISE EXCEPTION 'role % does not exist and % may not create it: create the '
                        'four service roles first (runwire_submitter, runwire_executor, '
                        'runwire_relay, runwire_recovery, NOLOGIN)', v_role, current_user;
            END;
        END IF;
    END LOOP;
END
$$;

DO $$
DECLARE
    v_function regprocedure;
BEGIN
    FOR v_function IN
        SELECT p.oid::regprocedure FROM pg_proc p
          JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = current_schema()
           AND p.proname IN ('run_messages', 'outbox_put', 'outbox_frame', 'release_session_turn',
                             'budget_spend_track', 'effect_budget_close')
    LOOP
        EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path FROM CURRENT',
                       v_function);
    END LOOP;
END
$$;

-- Every service: read runs and what it needs to start (the migrations applied), use the
-- sequences of the rows it inserts, and publish what its own transitions left in the
-- outbox (read, then delete, the rows of its transactions).
GRANT SELECT ON runs, schema_migrations, run_events TO
    runwire_submitter, runwire_executor, runwire_relay, runwire_recovery;
GRANT SELECT, DELETE ON outbox TO
    runwire_submitter, runwire_executor, runwire_relay, runwire_recovery;
GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO
    runwire_submitter, runwire_executor, runwire_relay, runwire_recovery;

-- The submitter: accepts runs, cancels them, answers reads, an operator's effect
-- resolutions, budgets and policies.
GRANT INSERT, UPDATE ON runs TO runwire_submitter;
GRANT INSERT ON run_events TO runwire_submitter;
GRANT SELECT, UPDATE ON effects TO runwire_submitter;
GRANT SELECT ON budget_reservations, tenant_spend, runners TO runwire_submitter;
GRANT SELECT, INSERT, UPDATE ON tenant_budgets, tenant_policies TO runwire_submitter;

-- The executor: claims, heartbeats and closes attempts; effects; reservations; reads
-- what a resumed attempt continues; records the runners it serves.
GRANT UPDATE ON runs TO runwire_executor;
GRANT INSERT ON run_events TO runwire_executor;
GRANT SELECT, INSERT, UPDATE ON effects, budget_reservations, runners TO runwire_executor;
GRANT SELECT ON tenant_budgets, tenant_spend, tenant_policies, frame_segments
    TO runwire_executor;

-- The relay: writes frame segments and the runs' frame counters.
GRANT UPDATE ON runs TO runwire_relay;
GRANT SELECT, INSERT ON frame_segments TO runwire_relay;

-- Recovery: expires leases, times out queues, closes runs, sweeps the outbox and the run
-- events, releases orphaned reservations, deletes expired frames.
GRANT UPDATE ON runs TO runwire_recovery;
GRANT INSERT, UPDATE ON run_events TO runwire_recovery;
GRANT UPDATE ON outbox TO runwire_recovery;
GRANT SELECT, DELETE ON frame_segments TO runwire_recovery;
GRANT SELECT, UPDATE ON budget_reservations TO runwire_recovery;
GRANT SELECT ON effects TO runwire_recovery;
