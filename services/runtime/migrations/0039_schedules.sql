-- Schedules: a tenant's runs started by a cron expression in a time zone. Recovery fires
-- each one that is due (the row locked, so one replica fires it), each fire once (its
-- runs' request ids name the schedule and the fire's time).
CREATE TABLE schedules (
    tenant text NOT NULL,
    name text NOT NULL,
    cron text NOT NULL,
    tz text NOT NULL,
    runner text NOT NULL,
    input jsonb NOT NULL,
    overlap text NOT NULL CHECK (overlap IN ('skip', 'buffer', 'allow')),
    catch_up_s integer NOT NULL CHECK (catch_up_s >= 0),
    paused boolean NOT NULL DEFAULT false,
    max_attempts integer NOT NULL,
    attempt_timeout_ms integer NOT NULL,
    next_fire_at timestamptz NOT NULL,
    last_fire_at timestamptz,
    fired bigint NOT NULL DEFAULT 0,
    skipped bigint NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, name)
);
CREATE INDEX schedules_due ON schedules (next_fire_at) WHERE NOT paused;
GRANT SELECT, INSERT, UPDATE, DELETE ON schedules TO runwire_submitter;
GRANT SELECT, UPDATE ON schedules TO runwire_recovery;
