-- Runs that wait: a run's attempt may end to wait for an answer (an interrupt), a
-- signal or a timer (a durable sleep), holding no worker; the run is then 'waiting' until the wait is answered or
-- times out. Each wait of a run is a row of run_waits, decided once (answered or
-- timed_out); signals sent to a run are kept in its mailbox, run_signals, until a wait
-- takes them. The functions that read and write them are in sql/functions/waits.sql.
ALTER TYPE run_status ADD VALUE IF NOT EXISTS 'waiting' AFTER 'recovering';

-- Attempts of the run that ended to wait: not counted against max_attempts.
ALTER TABLE runs ADD COLUMN waits integer NOT NULL DEFAULT 0;

CREATE TABLE run_waits (
    run_id     uuid NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    wait_id    text NOT NULL,
    kind       text NOT NULL CHECK (kind IN ('interrupt', 'signal', 'sleep')),
    name       text,
    payload    jsonb,
    timeout_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    outcome    text CHECK (outcome IN ('answered', 'timed_out')),
    value      jsonb,
    request_id text,
    decided_at timestamptz,
    PRIMARY KEY (run_id, wait_id)
);
-- The waits whose timeout recovery looks for, soonest first.
CREATE INDEX run_waits_due ON run_waits (timeout_at)
    WHERE outcome IS NULL AND timeout_at IS NOT NULL;
CREATE UNIQUE INDEX run_waits_answer ON run_waits (run_id, request_id)
    WHERE request_id IS NOT NULL;

CREATE TABLE run_signals (
    run_id     uuid NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    seq        bigserial,
    name       text NOT NULL,
    payload    jsonb,
    request_id text NOT NULL,
    sent_at    timestamptz NOT NULL DEFAULT now(),
    taken_by   text,
    PRIMARY KEY (run_id, seq),
    UNIQUE (run_id, request_id)
);

GRANT SELECT ON run_waits, run_signals TO
    runwire_submitter, runwire_executor, runwire_relay, runwire_recovery;

ALTER TABLE run_events DROP CONSTRAINT run_events_event_known;
ALTER TABLE run_events ADD CONSTRAINT run_events_event_known CHECK (event IN (
    'submitted', 'claimed', 'finished', 'failed', 'canceled', 'retry', 'released',
    'cancel_requested', 'session_turn', 'recovering', 'interrupted',
    'waiting', 'resumed', 'signaled',
    'budget_reserved', 'budget_settled', 'budget_released', 'effect_resolved',
    'node_ready', 'node_started', 'node_retrying', 'node_waiting', 'node_completed',
    'node_failed', 'node_fell_back', 'node_skipped', 'node_timed_out')) NOT VALID;
