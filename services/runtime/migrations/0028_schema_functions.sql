-- The engine's functions and triggers are defined in sql/functions/ (their current text),
-- applied after the migrations whenever that text is one the database has not had. This
-- table records the texts applied (by digest); every service reads it as it starts.
CREATE TABLE schema_functions (
    digest     text PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
GRANT SELECT ON schema_functions TO
    runwire_submitter, runwire_executor, runwire_relay, runwire_recovery;
