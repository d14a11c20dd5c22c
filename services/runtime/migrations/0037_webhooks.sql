-- Signed completion webhooks: a tenant's endpoints, the secret its deliveries are signed
-- with, and each delivery (at least once, with the event's stable id; retried with
-- backoff; `failed` after its last attempt, kept to be seen).
CREATE TABLE webhook_endpoints (
    tenant text NOT NULL,
    url text NOT NULL,
    events text[] NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, url)
);
CREATE TABLE webhook_secrets (
    tenant text PRIMARY KEY,
    secret text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE webhook_deliveries (
    id bigserial PRIMARY KEY,
    tenant text NOT NULL,
    url text NOT NULL,
    msg_id text NOT NULL,
    event text NOT NULL,
    body jsonb NOT NULL,
    state text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts integer NOT NULL DEFAULT 0,
    next_at timestamptz NOT NULL DEFAULT now(),
    last_error text,
    created_at timestamptz NOT NULL DEFAULT now(),
    ended_at timestamptz,
    UNIQUE (url, msg_id)
);
-- The deliveries due, oldest first; a tenant's failed ones, newest first.
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_at) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_failed ON webhook_deliveries (tenant, ended_at DESC)
 WHERE state = 'failed';

GRANT SELECT, INSERT, UPDATE, DELETE ON webhook_endpoints, webhook_secrets TO runwire_submitter;
GRANT SELECT ON webhook_deliveries TO runwire_submitter;
GRANT SELECT ON webhook_secrets TO runwire_recovery;
GRANT SELECT, UPDATE, DELETE ON webhook_deliveries TO runwire_recovery;
