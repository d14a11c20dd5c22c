-- Rate limits of a model provider's key or of one of its models (`openai`,
-- `openai:gpt-4o`), in requests and tokens per minute, shared by every executor: each
-- model call takes its grant before it is made (sql/functions/rate_limits.sql).
CREATE TABLE rate_limits (
    key text PRIMARY KEY CHECK (length(key) BETWEEN 1 AND 200),
    rpm integer CHECK (rpm > 0),
    tpm integer CHECK (tpm > 0),
    -- What the provider said last: no call before `blocked_until` (a 429's Retry-After);
    -- at `observed_at`, `tokens_left` of its `tokens_limit`, full again at
    -- `tokens_reset_at` (and the same of requests): its rate-limit headers.
    blocked_until timestamptz,
    observed_at timestamptz,
    tokens_left integer,
    tokens_limit integer,
    tokens_reset_at timestamptz,
    requests_left integer,
    requests_limit integer,
    requests_reset_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- The calls granted under each limit: the tokens reserved until the call is settled,
-- then the tokens it used. A grant counts for a minute from `at`.
CREATE TABLE rate_grants (
    id bigserial PRIMARY KEY,
    key text NOT NULL,
    run_id uuid NOT NULL,
    call text NOT NULL,
    tokens integer NOT NULL CHECK (tokens >= 0),
    settled boolean NOT NULL DEFAULT false,
    at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX rate_grants_window ON rate_grants (key, at);
CREATE INDEX rate_grants_call ON rate_grants (run_id, call) WHERE NOT settled;

-- The runs waiting for room under a limit, first come first served: the call each
-- waits to make (its tokens, its limits).
CREATE TABLE rate_waiters (
    run_id uuid PRIMARY KEY,
    call text NOT NULL,
    keys text[] NOT NULL,
    tokens integer NOT NULL CHECK (tokens >= 0),
    since timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX rate_waiters_keys ON rate_waiters USING gin (keys);

-- A queued run whose call waits for room under this limit (its job is due when the
-- room comes).
ALTER TABLE runs ADD COLUMN limit_key text;

GRANT SELECT, INSERT, UPDATE, DELETE ON rate_limits TO runwire_submitter;
GRANT SELECT ON rate_limits TO runwire_executor, runwire_recovery;
GRANT SELECT ON rate_grants, rate_waiters TO runwire_submitter, runwire_recovery;

-- The run event of an attempt that ended to wait for room under a rate limit.
ALTER TABLE run_events DROP CONSTRAINT run_events_event_known;
ALTER TABLE run_events ADD CONSTRAINT run_events_event_known CHECK (event IN (
    'submitted', 'claimed', 'finished', 'failed', 'canceled', 'retry', 'released',
    'cancel_requested', 'session_turn', 'share_turn', 'rescheduled', 'recovering',
    'interrupted', 'rate_limited', 'rate_granted',
    'waiting', 'resumed', 'signaled',
    'budget_reserved', 'budget_settled', 'budget_released', 'effect_resolved',
    'node_ready', 'node_started', 'node_retrying', 'node_waiting', 'node_resumed',
    'node_completed', 'node_failed', 'node_fell_back', 'node_skipped', 'node_timed_out'))
    NOT VALID;
