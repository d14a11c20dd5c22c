-- One way out of a transaction. Whatever a committed transition implies (the job that
-- queues the run's next attempt, the closing frames of a run, and the job of the next
-- run of its session) is written to `outbox` by the triggers below, in the transition's
-- own transaction, and published from there: by the committing service right after its
-- commit (rows of its transaction that are due at once), and by one sweep (recovery)
-- for everything else: rows due later and rows a crash left behind. A row's `msg_id` is
-- its `Nats-Msg-Id`, so publishing it twice stores it once. A transition's run event is
-- its `run_events` row, which the same sweep publishes (oldest first, one sweeper at a
-- time, so a run's events stay in order) and marks published (`published_at`).

CREATE TYPE outbox_kind AS ENUM ('job', 'frame', 'event');

CREATE TABLE outbox (
    id            bigserial PRIMARY KEY,
    kind          outbox_kind NOT NULL,
    tenant        text NOT NULL,
    run_id        uuid NOT NULL,
    msg_id        text NOT NULL,
    body          jsonb NOT NULL,
    trace_parent  text,
    -- The transaction that wrote the row: its service publishes the rows it wrote.
    xact          xid8 NOT NULL DEFAULT pg_current_xact_id(),
    due_at        timestamptz NOT NULL DEFAULT now(),
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE INDEX outbox_by_xact ON outbox (xact);
CREATE INDEX outbox_by_due ON outbox (due_at, id);
CREATE INDEX outbox_jobs_by_run ON outbox (run_id) WHERE kind = 'job';

-- The first frame an attempt's closing transition writes (its frames after the
-- attempt's own, in its generation); NULL when the run is closed outside an attempt
-- (its closing frames then come as a generation above every attempt's, from seq 1).
ALTER TABLE runs ADD COLUMN close_seq integer;

-- The span that decided the run's latest transition (an attempt's outcome, its retry
-- decision): the parent, in the run's trace, of the messages the transition implies
-- (the next attempt's job, the closing frames). NULL: the run's own trace.
ALTER TABLE runs ADD COLUMN implied_trace_parent text;

-- The last time recovery checked that a waiting run's job is still in the stream.
ALTER TABLE runs ADD COLUMN job_checked_at timestamptz;

-- Event names are defined once in contracts (RunEventName); this mirrors them. ('due'
-- rows of earlier versions stay as history.)
ALTER TABLE run_events ADD CONSTRAINT run_events_event_known CHECK (event IN (
    'submitted', 'claimed', 'finished', 'failed', 'canceled', 'retry', 'released',
    'cancel_requested', 'session_turn', 'recovering', 'interrupted')) NOT VALID;

-- A time as the wire writes it: RFC 3339 in UTC, whatever the session's time zone.
CREATE FUNCTION rfc3339(p_at timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT to_char(p_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
$$;

-- Write one message to the outbox; a NULL msg_id becomes `<kind>:<run_id>:<row id>`
-- (unique across databases and resets: run ids are UUIDs).
CREATE FUNCTION outbox_put(p_kind outbox_kind, p_tenant text, p_run_id uuid, p_msg_id text,
                           p_body jsonb, p_trace_parent text, p_due_at timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint := nextval(pg_get_serial_sequence('outbox', 'id'));
BEGIN
    INSERT INTO outbox (id, kind, tenant, run_id, msg_id, body, trace_parent, due_at)
    VALUES (v_id, p_kind, p_tenant, p_run_id,
            coalesce(p_msg_id, p_kind::text || ':' || p_run_id || ':' || v_id),
            p_body, p_trace_parent, p_due_at);
END
$$;

-- A raw frame of run `r`, as an attempt would publish it.
CREATE FUNCTION outbox_frame(r runs, p_generation integer, p_seq integer, p_type text,
                             p_data jsonb)
RETURNS void LANGUAGE sql AS $$
    SELECT outbox_put('frame', r.tenant, r.run_id,
                      r.run_id || ':' || p_generation || ':' || p_seq,
                      jsonb_build_object('v', 1, 'run_id', r.run_id, 'tenant', r.tenant,
                                         'generation', p_generation, 'seq', p_seq,
                                         'type', p_type, 'data', p_data,
                                         'at', rfc3339(clock_timestamp())),
                      coalesce(r.implied_trace_parent, r.trace_parent), now())
$$;

-- The runs of a session whose turn has come (no earlier run of the session holds it)
-- get their job; returns how many. Called when a run of the session ends, and by
-- recovery when a canceled run's grace passes.
CREATE FUNCTION release_session_turn(p_tenant text, p_session text, p_actor text)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    released integer;
BEGIN
    WITH due AS (
        SELECT run_id FROM runs
         WHERE tenant = p_tenant AND session_id = p_session
           AND status = 'queued' AND job_published_at IS NULL
           AND NOT session_blocked(tenant, session_id, submit_seq)
         ORDER BY submit_seq
           FOR UPDATE SKIP LOCKED
    ), upd AS (
        UPDATE runs r SET job_published_at = now(), updated_at = now()
          FROM due WHERE r.run_id = due.run_id
        RETURNING r.*
    )
    INSERT INTO run_events (run_id, event, status, attempt, actor, reason)
    SELECT run_id, 'session_turn', status, attempts, p_actor,
           'no earlier run of its session is active'
      FROM upd;
    GET DIAGNOSTICS released = ROW_COUNT;
    RETURN released;
END
$$;

-- What a change of a run implies, written with it:
--  * a job, each time one is issued (job_published_at set or renewed while the run waits
--    for an attempt), due when the run may start;
--  * when the run ends: an `error` frame (unless it finished or was canceled) and `done`,
--    its pending jobs dropped, and the next run of its session released;
--  * when an attempt fails and the run goes back to the queue: the attempt's `error` frame.
CREATE FUNCTION run_messages() RETURNS trigger LANGUAGE plpgsql AS $$
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

CREATE TRIGGER runs_publish_insert AFTER INSERT ON runs
    FOR EACH ROW EXECUTE FUNCTION run_messages();
CREATE TRIGGER runs_publish_update AFTER UPDATE OF status, job_published_at ON runs
    FOR EACH ROW
    WHEN (NEW.status IS DISTINCT FROM OLD.status
          OR NEW.job_published_at IS DISTINCT FROM OLD.job_published_at)
    EXECUTE FUNCTION run_messages();
