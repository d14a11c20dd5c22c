-- Workflows: a workflow run's nodes, their inputs, outcomes and frames.
-- The current definition of each function and trigger here: edit them in this file, never
-- in a migration (runwire.runtime.store.schema applies the files when they change).

-- A node's input template with every {"$ref": "a.b.c"} replaced by that path of `p_ctx`
-- ({"input": ..., "nodes": {slot: output}}), or null where the path has no value.
CREATE OR REPLACE FUNCTION workflow_resolve(p_template jsonb, p_ctx jsonb)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_out jsonb;
BEGIN
    CASE jsonb_typeof(p_template)
    WHEN 'object' THEN
        IF p_template ? '$ref' AND jsonb_typeof(p_template->'$ref') = 'string'
           AND (SELECT count(*) FROM jsonb_object_keys(p_template)) = 1 THEN
            RETURN coalesce(p_ctx #> string_to_array(p_template->>'$ref', '.'), 'null'::jsonb);
        END IF;
        SELECT coalesce(jsonb_object_agg(key, workflow_resolve(value, p_ctx)), '{}'::jsonb)
          INTO v_out FROM jsonb_each(p_template);
        RETURN v_out;
    WHEN 'array' THEN
        SELECT coalesce(jsonb_agg(workflow_resolve(value, p_ctx) ORDER BY ord), '[]'::jsonb)
          INTO v_out FROM jsonb_array_elements(p_template) WITH ORDINALITY AS e(value, ord);
        RETURN v_out;
    ELSE
        RETURN p_template;
    END CASE;
END
$$;

-- The definition's node `p_node`, or NULL.
CREATE OR REPLACE FUNCTION workflow_node(p_definition jsonb, p_node text)
RETURNS jsonb LANGUAGE sql IMMUTABLE AS $$
    SELECT n FROM jsonb_array_elements(p_definition->'nodes') n WHERE n->>'id' = p_node
$$;

-- A `node` frame on the workflow run's stream (generation 1, after its last frame).
CREATE OR REPLACE FUNCTION workflow_frame(p_run runs, p_type text, p_data jsonb)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path TO 'public', 'pg_temp' AS $$
DECLARE
    v_seq integer;
BEGIN
    UPDATE workflow_runs SET frame_seq = frame_seq + 1 WHERE run_id = p_run.run_id
    RETURNING frame_seq INTO v_seq;
    PERFORM outbox_frame(p_run, 1, v_seq, p_type, p_data);
END
$$;
REVOKE ALL ON FUNCTION workflow_frame(runs, text, jsonb) FROM PUBLIC;

-- A node event of the workflow run, numbered after the last one (fenced by that
-- number), once per key; false when the key was used before.
CREATE OR REPLACE FUNCTION workflow_event(p_run runs, p_node node_runs, p_event text,
    p_key text, p_code text, p_reason text, p_actor text)
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER SET search_path TO 'public', 'pg_temp'
AS $$
DECLARE
    v_seq bigint;
    v_at timestamptz;
    v_expected bigint;
BEGIN
    SELECT event_seq INTO v_expected FROM workflow_runs WHERE run_id = p_run.run_id;
    UPDATE workflow_runs
       SET event_seq = event_seq + 1, event_at = greatest(event_at, clock_timestamp())
     WHERE run_id = p_run.run_id AND event_seq = v_expected
    RETURNING event_seq, event_at INTO v_seq, v_at;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'node event of run % out of sequence', p_run.run_id;
    END IF;
    INSERT INTO run_events (run_id, event, status, attempt, actor, code, reason, at,
                            node_id, seq, idempotency_key)
    VALUES (p_run.run_id, p_event, p_run.status, p_node.attempt, p_actor, p_code,
            left(p_reason, 2000), v_at, p_node.node_id, v_seq, p_key)
    ON CONFLICT (run_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING;
    IF NOT FOUND THEN
        -- Used before: give the number back, so that numbers stay consecutive.
        UPDATE workflow_runs SET event_seq = event_seq - 1 WHERE run_id = p_run.run_id;
        RETURN false;
    END IF;
    RETURN true;
END
$$;
REVOKE ALL ON FUNCTION workflow_event(runs, node_runs, text, text, text, text,
    text) FROM PUBLIC;

-- Move node run `p_node` (as read under the workflow run's lock) to `p_status`, fenced
-- by its version, with its event and (unless `p_quiet`) its `node` frame. False when
-- another change came first (nothing written).
CREATE OR REPLACE FUNCTION workflow_node_move(p_run runs, p_node node_runs,
    p_status node_status, p_action text, p_attempt integer, p_output jsonb, p_error jsonb,
    p_reason text, p_fallback text, p_settled boolean, p_actor text, p_quiet boolean)
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER SET search_path TO 'public', 'pg_temp'
AS $$
DECLARE
    v_node node_runs;
    v_data jsonb;
    v_generation integer;
BEGIN
    UPDATE node_runs
       SET status = p_status, version = version + 1, attempt = greatest(attempt, p_attempt),
           output = coalesce(p_output, output), error = coalesce(p_error, error),
           settled = p_settled, updated_at = clock_timestamp(),
           ended_at = CASE WHEN p_status IN ('completed', 'failed', 'timed_out', 'skipped')
                           THEN clock_timestamp() END
     WHERE node_run_id = p_node.node_run_id AND version = p_node.version
    RETURNING * INTO v_node;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    -- The key names the attempt by its generation, which only grows (an attempt handed
    -- back at shutdown does not count, so `attempt` may repeat). A key used before keeps
    -- its event.
    SELECT generation INTO v_generation FROM runs WHERE run_id = v_node.node_run_id;
    PERFORM workflow_event(p_run, v_node, 'node_' || p_action,
                           p_action || ':' || v_node.node_run_id || ':'
                               || coalesce(v_generation, 0),
                           p_error->>'code', p_reason, p_actor);
    IF NOT p_quiet THEN
        v_data := jsonb_build_object('node_id', v_node.node_id, 'slot', v_node.slot,
                                     'node_run_id', v_node.node_run_id, 'action', p_action,
                                     'status', p_status, 'attempt', v_node.attempt);
        IF p_reason IS NOT NULL THEN
            v_data := v_data || jsonb_build_object('reason', left(p_reason, 2000));
        END IF;
        IF p_error ? 'code' THEN
            v_data := v_data || jsonb_build_object('code', p_error->>'code');
        END IF;
        IF p_fallback IS NOT NULL THEN
            v_data := v_data || jsonb_build_object('fallback', p_fallback);
        END IF;
        PERFORM workflow_frame(p_run, 'node', v_data);
    END IF;
    RETURN true;
END
$$;
REVOKE ALL ON FUNCTION workflow_node_move(runs, node_runs, node_status, text, integer,
    jsonb, jsonb, text, text, boolean, text, boolean) FROM PUBLIC;

-- Create the node run of node `p_node` for slot `p_slot` (once: a node runs at most once
-- in a workflow run), with its input resolved from the workflow input and the outputs
-- of the settled slots, and its run (queued, with its job in the outbox).
CREATE OR REPLACE FUNCTION workflow_node_create(p_run runs, p_definition jsonb, p_node text,
    p_slot text, p_actor text)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path TO 'public', 'pg_temp' AS $$
DECLARE
    v_spec jsonb := workflow_node(p_definition, p_node);
    v_ctx jsonb;
    v_input jsonb;
    v_id uuid := gen_random_uuid();
    v_node node_runs;
BEGIN
    SELECT jsonb_build_object(
               'input', p_run.input,
               'nodes', coalesce(jsonb_object_agg(slot, coalesce(output, 'null'::jsonb))
                                     FILTER (WHERE settled), '{}'::jsonb))
      INTO v_ctx FROM node_runs WHERE run_id = p_run.run_id;
    v_input := workflow_resolve(coalesce(v_spec->'input', '{"$ref": "input"}'::jsonb), v_ctx);
    IF jsonb_typeof(v_input) <> 'object' THEN
        v_input := jsonb_build_object('value', v_input);
    END IF;
    IF v_spec->>'effect' IS NOT NULL THEN
        v_input := jsonb_build_object('kind', v_spec->>'effect', 'request', v_input);
    ELSIF v_spec->>'signal' IS NOT NULL THEN
        v_input := jsonb_build_object('name', v_spec->>'signal');
    END IF;
    INSERT INTO node_runs (node_run_id, run_id, node_id, slot, deadline_at)
    VALUES (v_id, p_run.run_id, p_node, p_slot,
            clock_timestamp() + make_interval(secs => (v_spec->>'deadline_ms')::bigint / 1000.0))
    ON CONFLICT ON CONSTRAINT node_runs_once DO NOTHING
    RETURNING * INTO v_node;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    INSERT INTO runs (run_id, tenant, request_id, multitask, runner, input, metadata,
                      max_attempts, attempt_timeout_ms, job_published_at, created_at,
                      updated_at, trace_parent, budget_tokens, budget_cost, effects,
                      auth_fence, parent_run_id, node_id, retry_base_ms)
    -- Its request_id comes from its random id: no client's submit can take it first.
    VALUES (v_id, p_run.tenant, 'node:' || v_id, 'enqueue',
            coalesce(v_spec->>'runner',
                     CASE WHEN v_spec->>'signal' IS NOT NULL THEN 'signal' ELSE 'effect' END),
            v_input,
            jsonb_build_object('workflow_run', p_run.run_id, 'node', p_node),
            CASE WHEN v_spec->>'on_failure' = 'fail_run' THEN 1  -- fails the run at once
                 ELSE coalesce((v_spec #>> '{retry,max_attempts}')::integer, 3) END,
            coalesce((v_spec->>'attempt_timeout_ms')::integer, p_run.attempt_timeout_ms),
            now(), clock_timestamp(), clock_timestamp(), p_run.trace_parent,
            p_run.budget_tokens, p_run.budget_cost, p_run.effects, p_run.auth_fence,
            p_run.run_id, p_node, (v_spec #>> '{retry,backoff_ms}')::integer);
    INSERT INTO run_events (run_id, event, status, attempt, actor, reason)
    VALUES (v_id, 'submitted', 'queued', 0, p_actor,
            'node ' || p_node || ' of workflow run ' || p_run.run_id);
    PERFORM workflow_event(p_run, v_node, 'node_ready', 'ready:' || v_id || ':0', NULL,
                           CASE WHEN p_slot = p_node THEN 'every node before it ended'
                                ELSE 'runs in place of ' || p_slot END, p_actor);
END
$$;
REVOKE ALL ON FUNCTION workflow_node_create(runs, jsonb, text, text, text) FROM PUBLIC;

-- Start the nodes whose slots' predecessors are all settled; when every slot is settled
-- and no node runs, the workflow run finishes (its result: each slot's output).
CREATE OR REPLACE FUNCTION workflow_advance(p_run runs, p_actor text)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path TO 'public', 'pg_temp' AS $$
DECLARE
    v_definition jsonb;
    v_node text;
    v_outputs jsonb;
    v_seq integer;
BEGIN
    SELECT definition INTO v_definition FROM workflow_runs WHERE run_id = p_run.run_id;
    FOR v_node IN
        SELECT n->>'id' FROM jsonb_array_elements(v_definition->'nodes') n
         WHERE NOT EXISTS (  -- not some node's fallback: it runs only in its place
                   SELECT 1 FROM jsonb_array_elements(v_definition->'nodes') f
                    WHERE f->>'fallback' = n->>'id')
           AND NOT EXISTS (SELECT 1 FROM node_runs r
                            WHERE r.run_id = p_run.run_id AND r.node_id = n->>'id')
           AND NOT EXISTS (  -- a predecessor whose slot is not settled
                   SELECT 1 FROM jsonb_array_elements(v_definition->'edges') e
                    WHERE e->>'to' = n->>'id'
                      AND NOT EXISTS (SELECT 1 FROM node_runs s
                                       WHERE s.run_id = p_run.run_id
                                         AND s.slot = e->>'from' AND s.settled))
         ORDER BY n->>'id'
    LOOP
        PERFORM workflow_node_create(p_run, v_definition, v_node, v_node, p_actor);
    END LOOP;
    IF EXISTS (SELECT 1 FROM node_runs
                WHERE run_id = p_run.run_id AND status IN ('ready', 'running', 'waiting')) THEN
        RETURN;
    END IF;
    SELECT jsonb_object_agg(slot, output ORDER BY slot) FILTER (WHERE settled) INTO v_outputs
      FROM node_runs WHERE run_id = p_run.run_id;
    SELECT frame_seq INTO v_seq FROM workflow_runs WHERE run_id = p_run.run_id;
    WITH upd AS (
        UPDATE runs
           SET status = 'finished', result = jsonb_build_object('outputs', coalesce(v_outputs, '{}')),
               close_seq = v_seq + 1, lease_owner = NULL, ended_at = now(), updated_at = now()
         WHERE run_id = p_run.run_id AND status = 'running'
        RETURNING *
    )
    INSERT INTO run_events (run_id, event, status, attempt, actor, reason)
    SELECT run_id, 'finished', status, attempts, p_actor, 'every node ended' FROM upd;
END
$$;
REVOKE ALL ON FUNCTION workflow_advance(runs, text) FROM PUBLIC;

-- Stop every node run of the workflow run that has not ended (it failed, or was
-- canceled): each is marked failed with `p_error` (with its frame unless `p_quiet`),
-- and its run is canceled, or flagged for its executor; a run locked by a change of its
-- own is left to that change and to the sweep.
CREATE OR REPLACE FUNCTION workflow_stop_nodes(p_run runs, p_error jsonb, p_reason text,
    p_actor text, p_quiet boolean)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path TO 'public', 'pg_temp' AS $$
DECLARE
    v_node node_runs;
BEGIN
    FOR v_node IN SELECT * FROM node_runs
                   WHERE run_id = p_run.run_id AND status IN ('ready', 'running', 'waiting')
                   ORDER BY created_at, node_id
    LOOP
        PERFORM workflow_node_move(p_run, v_node, 'failed', 'failed', v_node.attempt, NULL,
                                   p_error, p_reason, NULL, false, p_actor, p_quiet);
    END LOOP;
    PERFORM workflow_cancel_runs(p_run.run_id, NULL, p_error, p_actor, 'its workflow run ended');
END
$$;
REVOKE ALL ON FUNCTION workflow_stop_nodes(runs, jsonb, text, text, boolean) FROM PUBLIC;

-- Cancel the active node runs' runs of a workflow run (`p_only`: just that one), queued
-- ones at once, running ones flagged for their executor; a run another transaction
-- holds is left (to its own change, and to the sweep). Returns how many.
CREATE OR REPLACE FUNCTION workflow_cancel_runs(p_run_id uuid, p_only uuid, p_error jsonb,
    p_actor text, p_reason text)
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path TO 'public', 'pg_temp'
AS $$
DECLARE
    v_count integer;
BEGIN
    WITH target AS (
        SELECT run_id FROM runs
         WHERE parent_run_id = p_run_id AND (p_only IS NULL OR run_id = p_only)
           AND run_active(status) AND NOT cancel_requested
           FOR UPDATE SKIP LOCKED
    ), upd AS (
        UPDATE runs c
           SET cancel_requested = true, cancel_error = coalesce(c.cancel_error, p_error),
               cancel_deadline = coalesce(c.cancel_deadline, now()),
               status = CASE WHEN c.status = 'running' THEN c.status ELSE 'canceled'::run_status END,
               error = CASE WHEN c.status = 'running' THEN c.error
                            ELSE coalesce(c.cancel_error, p_error) END,
               ended_at = CASE WHEN c.status = 'running' THEN c.ended_at ELSE now() END,
               close_seq = NULL, updated_at = now()
          FROM target WHERE c.run_id = target.run_id
        RETURNING c.*
    )
    INSERT INTO run_events (run_id, event, status, attempt, actor, code, reason)
    SELECT run_id, 'cancel_requested', status, attempts, p_actor, p_error->>'code', p_reason
      FROM upd;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$$;
REVOKE ALL ON FUNCTION workflow_cancel_runs(uuid, uuid, jsonb, text, text) FROM PUBLIC;

-- The workflow run ends as failed with `p_error`: its other node runs stop first (their
-- frames before its closing ones).
CREATE OR REPLACE FUNCTION workflow_fail(p_run runs, p_error jsonb, p_actor text)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path TO 'public', 'pg_temp' AS $$
DECLARE
    v_seq integer;
BEGIN
    PERFORM workflow_stop_nodes(
        p_run, jsonb_build_object('code', 'CANCELED', 'retryable', false,
                                  'message', 'its workflow run failed'),
        'the workflow run failed', p_actor, false);
    SELECT frame_seq INTO v_seq FROM workflow_runs WHERE run_id = p_run.run_id;
    WITH upd AS (
        UPDATE runs
           SET status = 'failed', error = p_error, close_seq = v_seq + 1, lease_owner = NULL,
               ended_at = now(), updated_at = now()
         WHERE run_id = p_run.run_id AND status = 'running'
        RETURNING *
    )
    INSERT INTO run_events (run_id, event, status, attempt, actor, code, reason)
    SELECT run_id, 'failed', status, attempts, p_actor, p_error->>'code', p_error->>'message'
      FROM upd;
END
$$;
REVOKE ALL ON FUNCTION workflow_fail(runs, jsonb, text) FROM PUBLIC;

-- A workflow node whose run performed a side effect (or may have) does not fall back:
-- the node in its place would perform it again. The node's `fallback_after_effect`
-- lets its fallback run all the same; without it the workflow run fails with
-- NODE_FAILED, saying which effect kept the fallback from running.
CREATE OR REPLACE FUNCTION workflow_node_failed(p_run runs, p_node node_runs,
    p_status node_status, p_error jsonb, p_actor text)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path TO 'public', 'pg_temp' AS $$
DECLARE
    v_definition jsonb;
    v_spec jsonb;
    v_policy text;
    v_action text := CASE WHEN p_status = 'timed_out' THEN 'timed_out' ELSE 'failed' END;
    v_message text := coalesce(p_error->>'message', 'no reason given');
    v_effect text;
BEGIN
    SELECT definition INTO v_definition FROM workflow_runs WHERE run_id = p_run.run_id;
    v_spec := workflow_node(v_definition, p_node.node_id);
    v_policy := coalesce(v_spec->>'on_failure', 'retry');
    IF v_policy = 'fallback' AND NOT coalesce((v_spec->>'fallback_after_effect')::boolean, false)
    THEN
        -- An effect its run performed, or may have: the fallback would repeat it.
        SELECT key INTO v_effect FROM effects
         WHERE run_id = p_node.node_run_id AND state <> 'prepared'
           AND NOT (state = 'failed' AND error_code IS DISTINCT FROM 'EFFECT_DEADLINE_EXCEEDED')
         ORDER BY created_at, key LIMIT 1;
        IF v_effect IS NOT NULL THEN
            v_policy := 'retry';
            v_message := v_message || '; its fallback ' || (v_spec->>'fallback')
                         || ' does not run: the node performed effect ' || v_effect
                         || ', which it would repeat (fallback_after_effect allows it)';
        END IF;
    END IF;
    IF v_policy = 'skip' THEN
        PERFORM workflow_node_move(
            p_run, p_node, CASE WHEN p_status = 'timed_out' THEN 'timed_out'::node_status
                                ELSE 'skipped'::node_status END,
            CASE WHEN p_status = 'timed_out' THEN 'timed_out' ELSE 'skipped' END,
            p_node.attempt, NULL, p_error, v_message || '; skipped: the nodes after it run',
            NULL, true, p_actor, false);
        PERFORM workflow_advance(p_run, p_actor);
    ELSIF v_policy = 'fallback' THEN
        PERFORM workflow_node_move(
            p_run, p_node, p_status,
            CASE WHEN p_status = 'timed_out' THEN 'timed_out' ELSE 'fell_back' END,
            p_node.attempt, NULL, p_error,
            v_message || '; ' || (v_spec->>'fallback') || ' runs in its place',
            v_spec->>'fallback', false, p_actor, false);
        PERFORM workflow_node_create(p_run, v_definition, v_spec->>'fallback', p_node.slot,
                                     p_actor);
    ELSE
        PERFORM workflow_node_move(p_run, p_node, p_status, v_action, p_node.attempt, NULL,
                                   p_error, v_message, NULL, false, p_actor, false);
        PERFORM workflow_fail(
            p_run,
            jsonb_build_object(
                'code', CASE WHEN p_status = 'timed_out' THEN 'NODE_DEADLINE_EXCEEDED'
                             ELSE 'NODE_FAILED' END,
                'retryable', false,
                'message', 'node ' || p_node.node_id || ' '
                           || CASE WHEN p_status = 'timed_out' THEN 'timed out' ELSE 'failed' END
                           || ': ' || v_message),
            p_actor);
    END IF;
END
$$;
REVOKE ALL ON FUNCTION workflow_node_failed(runs, node_runs, node_status, jsonb,
    text) FROM PUBLIC;

-- A workflow run may start (at submit, or when its session's turn comes): it is running
-- as its generation 1, claimed by no executor.
CREATE OR REPLACE FUNCTION workflow_run_before()
RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path TO 'public', 'pg_temp'
AS $$
DECLARE
    v_active integer;
    v_seq integer;
BEGIN
    IF NEW.status = 'queued' AND NEW.job_published_at IS NOT NULL AND NOT NEW.cancel_requested
       AND (TG_OP = 'INSERT' OR OLD.job_published_at IS NULL) THEN
        NEW.status := 'running';
        NEW.attempts := 1;
        NEW.generation := 1;
        NEW.started_at := coalesce(NEW.started_at, now());
        NEW.lease_owner := 'workflow';
    ELSIF TG_OP = 'UPDATE' AND OLD.status = 'running' AND NEW.status = 'running'
          AND NEW.cancel_requested AND NOT OLD.cancel_requested THEN
        -- A cancel ends it at once (no executor will): its closing frames follow the
        -- `node` frames of the node runs it stops (workflow_run_after).
        SELECT count(*) INTO v_active FROM node_runs
         WHERE run_id = NEW.run_id AND status IN ('ready', 'running', 'waiting');
        SELECT frame_seq INTO v_seq FROM workflow_runs WHERE run_id = NEW.run_id;
        NEW.status := 'canceled';
        NEW.error := NEW.cancel_error;
        NEW.ended_at := now();
        NEW.lease_owner := NULL;
        NEW.close_seq := coalesce(v_seq, 0) + v_active + 1;
    END IF;
    RETURN NEW;
END
$$;
REVOKE ALL ON FUNCTION workflow_run_before() FROM PUBLIC;
CREATE OR REPLACE TRIGGER workflow_run_before BEFORE INSERT OR UPDATE ON runs FOR EACH ROW
    WHEN ((new.workflow IS NOT NULL)) EXECUTE FUNCTION workflow_run_before();

-- A workflow run started (its first frame, its first nodes) or canceled (its running
-- nodes stopped, their frames before its closing ones).
CREATE OR REPLACE FUNCTION workflow_run_after()
RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path TO 'public', 'pg_temp'
AS $$
DECLARE
    v_definition jsonb;
BEGIN
    IF NEW.status = 'running' AND (TG_OP = 'INSERT' OR OLD.status <> 'running') THEN
        SELECT definition INTO v_definition FROM releases
         WHERE tenant = NEW.tenant AND release_id = NEW.workflow->>'release_id'
           AND version = (NEW.workflow->>'version')::integer;
        INSERT INTO workflow_runs (run_id, definition) VALUES (NEW.run_id, v_definition)
        ON CONFLICT (run_id) DO NOTHING;
        PERFORM workflow_frame(NEW, 'run', jsonb_build_object('attempt', 1, 'resumed', false,
                                                              'partial_length', 0));
        PERFORM workflow_advance(NEW, 'workflow');
    ELSIF TG_OP = 'UPDATE' AND OLD.status = 'running' AND NEW.status = 'canceled' THEN
        PERFORM workflow_stop_nodes(NEW, NEW.error, 'the workflow run was canceled',
                                    'workflow', false);
    END IF;
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION workflow_run_after() FROM PUBLIC;
-- Named to fire before `runs_publish_update` (triggers fire in name order): a cancel's
-- node frames are written before the closing frames that follow them.
CREATE OR REPLACE TRIGGER runs_advance_workflow AFTER INSERT OR UPDATE ON runs FOR EACH ROW
    WHEN ((new.workflow IS NOT NULL)) EXECUTE FUNCTION workflow_run_after();

-- A node run's run changed status: what it means for the node, under the workflow
-- run's lock.
CREATE OR REPLACE FUNCTION workflow_node_run_changed()
RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path TO 'public', 'pg_temp'
AS $$
DECLARE
    v_run runs;
    v_node node_runs;
    v_actor text := coalesce(NEW.lease_owner, 'workflow');
    v_reason text;
BEGIN
    SELECT * INTO v_run FROM runs WHERE run_id = NEW.parent_run_id FOR UPDATE;
    SELECT * INTO v_node FROM node_runs WHERE node_run_id = NEW.run_id;
    IF NOT FOUND OR v_node.status NOT IN ('ready', 'running', 'waiting') THEN
        RETURN NULL;  -- it ended already (timed out, or stopped with its workflow run)
    END IF;
    IF run_terminal(v_run.status) THEN
        PERFORM workflow_node_move(
            v_run, v_node, 'failed', 'failed', NEW.attempts, NULL,
            jsonb_build_object('code', 'CANCELED', 'retryable', false,
                               'message', 'its workflow run ended'),
            'the workflow run ended', NULL, false, v_actor, true);
        RETURN NULL;
    END IF;
    IF NEW.status = 'running' THEN
        PERFORM workflow_node_move(v_run, v_node, 'running', 'started', NEW.attempts, NULL,
                                   NULL, 'attempt ' || NEW.attempts, NULL, false, v_actor,
                                   false);
    ELSIF NEW.status = 'waiting' THEN
        -- Its runner waits (an answer, a signal, a timer): what for, in words.
        SELECT CASE kind WHEN 'interrupt' THEN 'its run asks: ' || left(payload::text, 500)
                         WHEN 'signal' THEN 'its run waits for the signal ' || name
                         ELSE 'its run sleeps until ' || timeout_at END
          INTO v_reason
          FROM run_waits WHERE run_id = NEW.run_id AND outcome IS NULL
         ORDER BY created_at DESC LIMIT 1;
        PERFORM workflow_node_move(v_run, v_node, 'waiting', 'waiting', NEW.attempts, NULL,
                                   NULL, coalesce(v_reason, 'its run waits'), NULL, false,
                                   v_actor, false);
    ELSIF NEW.status = 'queued' AND OLD.status = 'waiting' THEN
        PERFORM workflow_node_move(v_run, v_node, 'ready', 'resumed', NEW.attempts, NULL,
                                   NULL, 'its wait was decided', NULL, false, v_actor, false);
    ELSIF NEW.status = 'queued' THEN
        PERFORM workflow_node_move(v_run, v_node, 'waiting', 'retrying', NEW.attempts, NULL,
                                   NEW.error, coalesce(NEW.error->>'message', 'retrying'),
                                   NULL, false, v_actor, false);
    ELSIF NEW.status = 'recovering' THEN
        PERFORM workflow_node_move(v_run, v_node, 'waiting', 'waiting', NEW.attempts, NULL,
                                   NULL, 'its executor stopped; it resumes elsewhere', NULL,
                                   false, 'recovery', false);
    ELSIF NEW.status = 'finished' THEN
        IF workflow_node_move(v_run, v_node, 'completed', 'completed', NEW.attempts,
                              coalesce(NEW.result, 'null'::jsonb), NULL, NULL, NULL, true,
                              v_actor, false) THEN
            PERFORM workflow_advance(v_run, v_actor);
        END IF;
    ELSE  -- failed, canceled, interrupted
        PERFORM workflow_node_failed(
            v_run, v_node, 'failed',
            coalesce(NEW.error, jsonb_build_object('code', 'RUNNER_ERROR', 'retryable', false,
                                                   'message', 'the node run ' || NEW.status)),
            v_actor);
    END IF;
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION workflow_node_run_changed() FROM PUBLIC;
CREATE OR REPLACE TRIGGER workflow_node_run_changed AFTER UPDATE OF status ON runs FOR EACH
    ROW WHEN (((new.parent_run_id IS NOT NULL) AND (old.status IS DISTINCT FROM
    new.status))) EXECUTE FUNCTION workflow_node_run_changed();

-- Recovery's part: node runs past their deadline become timed_out (once: fenced by the
-- node's version) and their on_failure applies; runs of node runs whose workflow run
-- ended, that the end could not stop (locked then), are stopped. Returns how many of
-- each.
CREATE OR REPLACE FUNCTION workflow_sweep(p_limit integer, OUT timed_out integer,
    OUT stopped integer)
RETURNS record LANGUAGE plpgsql SECURITY DEFINER SET search_path TO 'public', 'pg_temp'
AS $$
DECLARE
    v_due record;
    v_run runs;
    v_node node_runs;
    v_error jsonb;
BEGIN
    timed_out := 0;
    stopped := 0;
    FOR v_due IN SELECT node_run_id, run_id FROM node_runs
                  WHERE status IN ('ready', 'running', 'waiting') AND deadline_at <= now()
                  ORDER BY deadline_at LIMIT p_limit
    LOOP
        -- The lock order: the node's run, then its workflow run.
        PERFORM 1 FROM runs WHERE run_id = v_due.node_run_id FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        -- Never waits while holding what it took before: a busy workflow run is taken
        -- on a later tick.
        SELECT * INTO v_run FROM runs WHERE run_id = v_due.run_id FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        SELECT * INTO v_node FROM node_runs WHERE node_run_id = v_due.node_run_id;
        CONTINUE WHEN v_node.status NOT IN ('ready', 'running', 'waiting')
                   OR v_node.deadline_at > now() OR run_terminal(v_run.status);
        v_error := jsonb_build_object(
            'code', 'NODE_DEADLINE_EXCEEDED', 'retryable', false,
            'message', 'node ' || v_node.node_id || ' ran past its deadline of '
                       || (workflow_node((SELECT definition FROM workflow_runs
                                           WHERE run_id = v_run.run_id),
                                         v_node.node_id)->>'deadline_ms') || ' ms');
        PERFORM workflow_node_failed(v_run, v_node, 'timed_out', v_error, 'recovery');
        -- Its run stops (the node has ended: the run's own end changes nothing more).
        PERFORM workflow_cancel_runs(v_run.run_id, v_node.node_run_id, v_error, 'recovery',
                                     'its node ran past its deadline');
        timed_out := timed_out + 1;
    END LOOP;
    FOR v_due IN SELECT DISTINCT c.parent_run_id AS run_id FROM runs c JOIN runs p
                     ON p.run_id = c.parent_run_id
                  WHERE c.parent_run_id IS NOT NULL
                    AND c.status IN ('queued', 'running', 'recovering', 'waiting')  -- runs_active_nodes
                    AND NOT c.cancel_requested AND run_terminal(p.status)
                  LIMIT p_limit
    LOOP
        -- Their triggers take the ended workflow run: take it first, without waiting (no
        -- one waits for a node's run while holding its workflow run: SKIP LOCKED).
        PERFORM 1 FROM runs WHERE run_id = v_due.run_id FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        stopped := stopped + workflow_cancel_runs(
            v_due.run_id, NULL,
            jsonb_build_object('code', 'CANCELED', 'retryable', false,
                               'message', 'its workflow run ended'),
            'recovery', 'its workflow run ended');
    END LOOP;
END
$$;
REVOKE ALL ON FUNCTION workflow_sweep(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION workflow_sweep(integer) TO runwire_recovery;
