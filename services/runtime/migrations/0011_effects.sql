-- Side effects that happen once: each external action of a run is a row, keyed by the
-- runner's name for it within the run, moved through its states by guarded writes (each
-- expects the row's `version`). `fence` grows with each claim: an adapter that sees a
-- lower fence than it already saw for the idempotency key refuses the call, so a frozen
-- attempt that wakes up cannot dispatch over a newer one.
CREATE TYPE effect_state AS ENUM
    ('prepared', 'claimed', 'committed', 'failed', 'unknown', 'reconciled');

CREATE TABLE effects (
    run_id           uuid NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    key              text NOT NULL,
    kind             text NOT NULL,
    idempotency_key  text NOT NULL UNIQUE,
    request          jsonb NOT NULL,
    request_digest   text NOT NULL,
    state            effect_state NOT NULL DEFAULT 'prepared',
    version          integer NOT NULL DEFAULT 1,
    fence            bigint NOT NULL DEFAULT 0,
    -- The attempt (run generation) that holds the claim, and until when.
    claimed_generation integer,
    deadline_at      timestamptz,
    receipt          jsonb,
    error            text,
    -- The run's error code when the effect failed (EFFECT_FAILED, EFFECT_DEADLINE_EXCEEDED).
    error_code       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, key)
);
