-- runs, their event log and their frame segments.

CREATE TYPE run_status AS ENUM (
    'queued', 'running', 'recovering', 'finished', 'failed', 'canceled', 'interrupted'
);

CREATE TABLE runs (
    run_id              uuid PRIMARY KEY,
    tenant              text NOT NULL,
    request_id          text NOT NULL,
    session_id          text,
    multitask           text NOT NULL,
    runner              text NOT NULL,
    input               jsonb NOT NULL,
    metadata            jsonb NOT NULL DEFAULT '{}'::jsonb,
    status              run_status NOT NULL DEFAULT 'queued',
    attempts            integer NOT NULL DEFAULT 0,
    max_attempts        integer NOT NULL,
    generation          integer NOT NULL DEFAULT 0,
    attempt_timeout_ms  integer NOT NULL,
    queue_timeout_ms    integer,
    not_before          timestamptz NOT NULL DEFAULT now(),
    job_published_at    timestamptz,
    lease_owner         text,
    lease_expires_at    timestamptz,
    cancel_requested    boolean NOT NULL DEFAULT false,
    -- Text the run has delivered so far, saved by the attempt that produced it; a
    -- resumed attempt continues after it.
    partial_text        text NOT NULL DEFAULT '',
    checkpoint          jsonb,
    checkpoint_version  integer NOT NULL DEFAULT 0,
    recoveries          integer NOT NULL DEFAULT 0,
    recovery_checkpoint integer NOT NULL DEFAULT 0,
    last_seq            bigint NOT NULL DEFAULT 0,
    frame_count         bigint NOT NULL DEFAULT 0,
    frames_closed       boolean NOT NULL DEFAULT false,
    result              jsonb,
    error               jsonb,
    created_at          timestamptz NOT NULL DEFAULT now(),
    started_at          timestamptz,
    ended_at            timestamptz,
    updated_at          timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT runs_request_unique UNIQUE (tenant, request_id)
);

CREATE INDEX runs_active_by_status ON runs (status, updated_at)
    WHERE status IN ('queued', 'running', 'recovering');
CREATE INDEX runs_by_session ON runs (tenant, session_id, created_at)
    WHERE session_id IS NOT NULL;

CREATE TABLE run_events (
    id          bigserial PRIMARY KEY,
    run_id      uuid NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    at          timestamptz NOT NULL DEFAULT now(),
    event       text NOT NULL,
    status      run_status NOT NULL,
    attempt     integer NOT NULL,
    actor       text NOT NULL,
    code        text,
    reason      text
);

CREATE INDEX run_events_by_run ON run_events (run_id, id);

-- Frames packed by the relay: one row per flush, `frames` a JSON array in seq order.
CREATE TABLE frame_segments (
    run_id           uuid NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    first_seq        bigint NOT NULL,
    last_seq         bigint NOT NULL,
    last_stream_seq  bigint NOT NULL,
    frames           jsonb NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, first_seq)
);
