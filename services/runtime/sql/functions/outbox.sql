-- What a transition implies, written in its transaction: the outbox, a run's closing
-- frames, the relay's segments.
-- The current definition of each function and trigger here: edit them in this file, never
-- in a migration (runwire.runtime.store.schema applies the files when they change).

-- Write one message to the outbox; a NULL msg_id becomes `<kind>:<run_id>:<row id>`
-- (unique across databases and resets: run ids are UUIDs).
CREATE OR REPLACE FUNCTION outbox_put(p_kind outbox_kind, p_tenant text, p_run_id uuid,
    p_msg_id text, p_body jsonb, p_trace_parent text, p_due_at timestamp with time zone)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path TO 'public', 'pg_temp'
SET plan_cache_mode TO 'force_generic_plan' AS $$
DECLARE
    v_id bigint := nextval(pg_get_serial_sequence('outbox', 'id'));
BEGIN
    INSERT INTO outbox (id, kind, tenant, run_id, msg_id, body, trace_parent, due_at)
    VALUES (v_id, p_kind, p_tenant, p_run_id,
            coalesce(p_msg_id, p_kind::text || ':' || p_run_id || ':' || v_id),
            p_body, p_trace_parent, p_due_at);
END
$$;
REVOKE ALL ON FUNCTION outbox_put(outbox_kind, text, uuid, text, jsonb, text,
    timestamp with time zone) FROM PUBLIC;

-- A frame a transition implies (an attempt's closing `error` and `done`, a workflow's
-- `node` frames): its attempt's generation and its place among that attempt's frames;
-- the outbox's publisher numbers it after the run's last stored frame
-- (runwire.runtime.frame_chain). (The outbox row written here, not through outbox_put:
-- a frame's id is never NULL.)
CREATE OR REPLACE FUNCTION outbox_frame(r runs, p_generation integer, p_seq integer,
    p_type text, p_data jsonb)
RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path TO 'public', 'pg_temp'
SET plan_cache_mode TO 'force_generic_plan' AS $$
    INSERT INTO outbox (kind, tenant, run_id, msg_id, body, trace_parent, due_at)
    VALUES ('frame', r.tenant, r.run_id, r.run_id || ':' || p_generation || ':' || p_seq,
            jsonb_build_object('v', 1, 'run_id', r.run_id, 'tenant', r.tenant,
                               'generation', p_generation, 'seq', p_seq,
                               'type', p_type, 'data', p_data,
                               'at', rfc3339(clock_timestamp())),
            coalesce(r.implied_trace_parent, r.trace_parent), now())
$$;
REVOKE ALL ON FUNCTION outbox_frame(runs, integer, integer, text, jsonb) FROM PUBLIC;

-- What a change of a run implies, written with it:
--  * a job, each time one is issued (job_published_at set or renewed while the run waits
--    for an attempt), due when the run may start;
--  * when the run ends: an `error` frame (unless it finished or was canceled) and `done`,
--    its pending jobs dropped, and the next run of its session released;
--  * when it stops holding a job (it ended, or waits): its tenant's next runs released;
--  * when it ends or waits: a delivery to each of its tenant's webhook endpoints for that;
--  * when an attempt fails and the run goes back to the queue: the attempt's `error` frame.
CREATE OR REPLACE FUNCTION run_messages()
RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path TO 'public', 'pg_temp'
SET plan_cache_mode TO 'force_generic_plan' AS $$
DECLARE
    v_generation integer;
    v_seq integer;
    v_done jsonb;
BEGIN
    IF run_awaits_attempt(NEW.status) AND NEW.job_published_at IS NOT NULL
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
        IF NEW.parent_run_id IS NULL
           AND EXISTS (SELECT 1 FROM webhook_endpoints WHERE tenant = NEW.tenant) THEN
            PERFORM webhook_put(NEW, 'ended');
        END IF;
        IF NEW.session_id IS NOT NULL THEN
            PERFORM start_session_turn(NEW.tenant, NEW.session_id, 'session');
        END IF;
    ELSIF NEW.status = 'queued' AND OLD.status = 'running' AND NEW.close_seq IS NOT NULL
          AND NEW.error IS NOT NULL THEN
        PERFORM outbox_frame(NEW, v_generation, v_seq, 'error', NEW.error);
    END IF;
    IF NEW.status = 'waiting' AND NEW.parent_run_id IS NULL
       AND EXISTS (SELECT 1 FROM webhook_endpoints WHERE tenant = NEW.tenant) THEN
        PERFORM webhook_put(NEW, 'waiting');
    END IF;
    -- A run that stops holding a job (it ended, or waits for an answer) makes room in
    -- its tenant's share: the tenant's next waiting runs get theirs (at once, unless the
    -- statement ending a batch of runs starts its tenants' turns itself, once each:
    -- `share_turns_later`).
    IF NEW.parent_run_id IS NULL AND OLD.job_published_at IS NOT NULL
       AND OLD.status IN ('queued', 'running', 'recovering')
       AND NOT (NEW.status IN ('queued', 'running', 'recovering')
                AND NEW.job_published_at IS NOT NULL)
       AND current_setting('runwire.share_turns_later', true) IS DISTINCT FROM 'on' THEN
        PERFORM start_share_turn(NEW.tenant, 'share');
    END IF;
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION run_messages() FROM PUBLIC;
CREATE OR REPLACE TRIGGER runs_publish_insert AFTER INSERT ON runs FOR EACH ROW EXECUTE
    FUNCTION run_messages();
CREATE OR REPLACE TRIGGER runs_publish_update AFTER UPDATE OF status, job_published_at ON
    runs FOR EACH ROW WHEN (((new.status IS DISTINCT FROM old.status) OR
    (new.job_published_at IS DISTINCT FROM old.job_published_at))) EXECUTE FUNCTION
    run_messages();

-- Frames are no longer signed (the broker lets only services publish them).
DROP FUNCTION IF EXISTS frame_token(text, integer);

-- Two relays may flush frames of one run at once: one that lost its partition (after a
-- freeze) and its new owner, which repairs what is missing from the stream. Each flush
-- leaves out a segment that overlaps one already written, but a statement cannot see a
-- segment that a concurrent one has not committed yet, so both could be written and the
-- run's frames counted, and replayed, twice. A flush now first locks its runs (in one
-- order, so two flushes never deadlock), and only then, with a fresh snapshot, looks for
-- the segments already there: writes of one run's segments happen one at a time.
CREATE OR REPLACE FUNCTION write_segments(p_runs uuid[], p_first bigint[], p_last bigint[],
    p_last_stream bigint[], p_frames text[], p_closed boolean[])
RETURNS TABLE(run_id uuid, tenant text, last_seq bigint, frame_count bigint,
    done_written boolean)
LANGUAGE sql SET plan_cache_mode TO 'force_generic_plan' AS $$
    SELECT 1 FROM runs WHERE runs.run_id = ANY(p_runs) ORDER BY runs.run_id FOR NO KEY UPDATE;

    WITH ins AS (
        INSERT INTO frame_segments (run_id, first_seq, last_seq, last_stream_seq, frames)
        SELECT s.run_id, s.first_seq, s.last_seq, s.last_stream_seq, s.frames::jsonb
          FROM unnest(p_runs, p_first, p_last, p_last_stream, p_frames)
               AS s(run_id, first_seq, last_seq, last_stream_seq, frames)
         -- Segments never overlap, so that frame_count counts each frame once: one that
         -- overlaps a segment already written is left out; what it alone held is
         -- repaired from the stream. Segments are disjoint, so the one starting last at
         -- or before this one's end is the only one that can overlap it.
         WHERE coalesce((SELECT f.last_seq FROM frame_segments f
                          WHERE f.run_id = s.run_id AND f.first_seq <= s.last_seq
                          ORDER BY f.first_seq DESC LIMIT 1), 0) < s.first_seq
        ON CONFLICT ON CONSTRAINT frame_segments_pkey DO NOTHING
        RETURNING frame_segments.run_id, frame_segments.last_seq,
                  jsonb_array_length(frame_segments.frames) AS n
    ), per_run AS (
        SELECT i.run_id, max(i.last_seq) AS last_seq, sum(i.n) AS n, bool_or(u.closed) AS closed
          FROM ins i
          JOIN unnest(p_runs, p_last, p_closed) AS u(run_id, last_seq, closed)
            ON u.run_id = i.run_id AND u.last_seq = i.last_seq
         GROUP BY i.run_id
    )
    -- A run's frames are closed once `done` was written and no frame is missing.
    UPDATE runs r
       SET last_seq = GREATEST(r.last_seq, p.last_seq),
           frame_count = r.frame_count + p.n,
           frames_closed = r.frames_closed
               OR (p.closed AND r.frame_count + p.n >= GREATEST(r.last_seq, p.last_seq))
      FROM per_run p
     WHERE r.run_id = p.run_id
    RETURNING r.run_id, r.tenant, r.last_seq, r.frame_count, p.closed;
$$;
REVOKE ALL ON FUNCTION write_segments(uuid[], bigint[], bigint[], bigint[], text[],
    boolean[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION write_segments(uuid[], bigint[], bigint[], bigint[], text[],
    boolean[]) TO runwire_relay;

-- Published outbox rows are deleted in run id order. A finishing batch of runs deletes
-- their job rows in run id order too (run_messages, one run after the other): deleted in
-- any other order, the two could each hold a row the other waits for, until Postgres
-- broke the circle a second later (deadlock_timeout) by failing one of them.
--
-- Taking rows in an order needs SELECT ... FOR UPDATE, which needs UPDATE on the table;
-- the services may only read and delete the outbox. So the deletion is a function with
-- the rights of its owner, that deletes nothing a service could not delete itself.
CREATE OR REPLACE FUNCTION outbox_done(p_ids bigint[])
RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path TO 'public', 'pg_temp'
SET plan_cache_mode TO 'force_generic_plan' AS $$
    DELETE FROM outbox
     WHERE id IN (SELECT id FROM outbox WHERE id = ANY(p_ids)
                   ORDER BY run_id, id
                     FOR UPDATE);
$$;
REVOKE ALL ON FUNCTION outbox_done(bigint[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox_done(bigint[]) TO runwire_submitter;
GRANT EXECUTE ON FUNCTION outbox_done(bigint[]) TO runwire_executor;
GRANT EXECUTE ON FUNCTION outbox_done(bigint[]) TO runwire_relay;
GRANT EXECUTE ON FUNCTION outbox_done(bigint[]) TO runwire_recovery;

-- The current transaction's outbox rows that are due at once (not run events).
CREATE OR REPLACE FUNCTION xact_messages()
RETURNS jsonb LANGUAGE sql AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'id', o.id, 'kind', o.kind, 'tenant', o.tenant, 'run_id', o.run_id,
               'msg_id', o.msg_id, 'body', o.body::text, 'trace_parent', o.trace_parent,
               'runner', o.body->>'runner') ORDER BY o.id), '[]'::jsonb)
      FROM outbox o
     WHERE o.xact = pg_current_xact_id() AND o.kind <> 'event' AND o.due_at <= o.created_at
$$;
REVOKE ALL ON FUNCTION xact_messages() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION xact_messages() TO runwire_submitter;
GRANT EXECUTE ON FUNCTION xact_messages() TO runwire_executor;
