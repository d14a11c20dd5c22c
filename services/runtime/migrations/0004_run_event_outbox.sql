-- run_events doubles as the outbox of run events: a row is published on NATS after its
-- transition committed, and marked here; rows committed late are still found.

ALTER TABLE run_events ADD COLUMN published_at timestamptz;
-- Rows written before this migration are history, not news.
UPDATE run_events SET published_at = now();

CREATE INDEX run_events_unpublished ON run_events (id) WHERE published_at IS NULL;
