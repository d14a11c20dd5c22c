-- Fair share among tenants: each tenant has at most its share of jobs issued at once
-- (queued for an executor or running); its further runs wait in Postgres, without a job,
-- and get one as its earlier runs end. A tenant's queue has a capacity of its own.
-- The defaults (one row), written by the submitter from its settings at start.
CREATE TABLE queue_defaults (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    share_runs integer NOT NULL CHECK (share_runs > 0),
    max_queued_runs integer NOT NULL CHECK (max_queued_runs > 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO queue_defaults (share_runs, max_queued_runs) VALUES (64, 10000);
GRANT SELECT, INSERT, UPDATE ON queue_defaults TO runwire_submitter;
GRANT SELECT ON queue_defaults TO runwire_executor, runwire_relay, runwire_recovery;

-- An operator's per tenant: its weight (its share is share_runs times it), the capacity
-- of its queue (NULL: the default), and how many runs of one concurrency key may hold a
-- job at once (NULL: no limit).
ALTER TABLE tenant_budgets ADD COLUMN share integer CHECK (share > 0);
ALTER TABLE tenant_budgets ADD COLUMN max_queued_runs integer CHECK (max_queued_runs >= 0);
ALTER TABLE tenant_budgets ADD COLUMN max_runs_per_key integer CHECK (max_runs_per_key > 0);

-- A run's priority among its tenant's waiting runs (higher first), and its concurrency
-- key (a user id, say), whose runs hold at most the tenant's max_runs_per_key jobs at once.
ALTER TABLE runs ADD COLUMN priority smallint NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN concurrency_key text;
-- How long a waiting run may be passed over by runs of a higher priority: past it, it
-- goes first (age counts, so no level starves).
ALTER TABLE queue_defaults ADD COLUMN priority_max_wait_ms integer NOT NULL DEFAULT 60000
    CHECK (priority_max_wait_ms > 0);

-- A tenant's jobs issued at once, counted at every submit and every end.
CREATE INDEX runs_issued_by_tenant ON runs (tenant)
 WHERE status IN ('queued', 'running', 'recovering') AND job_published_at IS NOT NULL
   AND parent_run_id IS NULL;
-- A tenant's runs waiting for an attempt, oldest first: its queue's size, and the runs
-- without a job that get one next (by priority, or the oldest once it waited too long).
CREATE INDEX runs_queued_by_tenant ON runs (tenant, submit_seq)
 WHERE status = 'queued' AND parent_run_id IS NULL;
CREATE INDEX runs_queued_by_priority ON runs (tenant, priority DESC, submit_seq)
 WHERE status = 'queued' AND parent_run_id IS NULL;
-- A concurrency key's jobs issued at once.
CREATE INDEX runs_issued_by_key ON runs (tenant, concurrency_key)
 WHERE status IN ('queued', 'running', 'recovering') AND job_published_at IS NOT NULL
   AND concurrency_key IS NOT NULL;

-- The run event of a run whose tenant's share had room again: its job was issued.
ALTER TABLE run_events DROP CONSTRAINT run_events_event_known;
ALTER TABLE run_events ADD CONSTRAINT run_events_event_known CHECK (event IN (
    'submitted', 'claimed', 'finished', 'failed', 'canceled', 'retry', 'released',
    'cancel_requested', 'session_turn', 'share_turn', 'rescheduled', 'recovering',
    'interrupted',
    'waiting', 'resumed', 'signaled',
    'budget_reserved', 'budget_settled', 'budget_released', 'effect_resolved',
    'node_ready', 'node_started', 'node_retrying', 'node_waiting', 'node_resumed',
    'node_completed', 'node_failed', 'node_fell_back', 'node_skipped', 'node_timed_out'))
    NOT VALID;
