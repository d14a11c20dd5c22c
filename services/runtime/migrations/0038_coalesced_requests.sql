-- Submits whose input joined a run queued behind its busy session (multitask `coalesce`):
-- each request id names, once, the run that took its input (a repeat of the submit
-- answers with that run, and adds nothing).
CREATE TABLE coalesced_requests (
    tenant text NOT NULL,
    request_id text NOT NULL,
    run_id uuid NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, request_id)
);
CREATE INDEX coalesced_requests_run ON coalesced_requests (run_id);
GRANT SELECT, INSERT ON coalesced_requests TO runwire_submitter;
GRANT SELECT, DELETE ON coalesced_requests TO runwire_recovery;
