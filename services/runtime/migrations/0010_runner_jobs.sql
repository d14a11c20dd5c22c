-- A job carries its runner: it is published on `<prefix>.jobs.<runner>.<run_id>.job`, where
-- only executors that have the runner take it. The rest of `run_messages` is as in 0009.
-- Jobs still waiting under the old subjects are found missing by recovery and issued again.

CREATE OR REPLACE FUNCTION run_messages() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_generation integer;
    v_seq integer;
    v_done jsonb;
BEGIN
    IF run_waiting(NEW.status) AND NEW.job_published_at IS NOT NULL
       AND (TG_OP = 'INSERT' OR NEW.job_published_at IS DISTINCT FROM OLD.job_published_at)
    THEN
        PERFORM outbox_put('job', NEW.tenant, NEW.run_id, NULL,
                           jsonb_build_object('v', 1, 'run_id', NEW.run_id,
                                              'tenant', NEW.tenant,
                                              'runner', NEW.runner,
                                              'generation', NEW.generation),
                           coalesce(NEW.implied_trace_parent, NEW.trace_parent),
                           greatest(NEW.not_before, now()));
    END IF;
    IF TG_OP = 'INSERT' OR NEW.status = OLD.status THEN
        RETURN NULL;
    END IF;
    IF NEW.close_seq IS NOT NULL THEN
        v_generation := NEW.generation;
        v_seq := NEW.close_seq;
    ELSE
        v_generation := NEW.generation + 1;
        v_seq := 1;
    END IF;
    IF run_terminal(NEW.status) THEN
        DELETE FROM outbox WHERE run_id = NEW.run_id AND kind = 'job';
        IF NEW.status NOT IN ('finished', 'canceled') AND NEW.error IS NOT NULL THEN
            PERFORM outbox_frame(NEW, v_generation, v_seq, 'error', NEW.error);
            v_seq := v_seq + 1;
        END IF;
        v_done := jsonb_build_object('status', NEW.status);
        IF NEW.status <> 'finished' AND NEW.error ? 'code' THEN
            v_done := v_done || jsonb_build_object('code', NEW.error->'code');
        END IF;
        PERFORM outbox_frame(NEW, v_generation, v_seq, 'done', v_done);
        IF NEW.session_id IS NOT NULL THEN
            PERFORM release_session_turn(NEW.tenant, NEW.session_id, 'session');
        END IF;
    ELSIF NEW.status = 'queued' AND OLD.status = 'running' AND NEW.close_seq IS NOT NULL
          AND NEW.error IS NOT NULL THEN
        PERFORM outbox_frame(NEW, v_generation, v_seq, 'error', NEW.error);
    END IF;
    RETURN NULL;
END
$$;

-- The runners the deployment has: each executor records the runners it serves (with the
-- JSON Schema of their input) as it starts. The submitter accepts runs for these runners
-- (and for those it has itself) and checks their input against the schema, so that a
-- runner installed only beside some executors is still known and checked.
CREATE TABLE runners (
    name          text PRIMARY KEY,
    input_schema  jsonb,
    registered_by text NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT now()
);

-- The fingerprint of the configuration a run's attempts must run with (a model
-- runner's model, base URL and sampling settings), pinned at submit or by the first
-- attempt. An attempt that would run with another fails with MODEL_CHANGED.
ALTER TABLE runs ADD COLUMN config_pin text;
