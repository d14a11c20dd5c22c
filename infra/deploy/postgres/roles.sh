#!/bin/sh
# The postgres image runs this once, when it initialises an empty data directory
# (compose.yaml mounts it into /docker-entrypoint-initdb.d/).
#
# Each service connects as a login of its own that is a member of its service's role
# (docs/security.md, "Least privilege in Postgres"). The four roles are created here, before
# runwire-migrate runs, and migration 0015 grants them what each service may do; the
# owner of the schema (POSTGRES_USER) is the one who migrates.
set -eu

# psql reads the passwords as variables (:'name' quotes each as a literal), so none is
# pasted into the SQL text.
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
    -v submitter="$SUBMITTER_DB_PASSWORD" \
    -v executor="$EXECUTOR_DB_PASSWORD" \
    -v relay="$RELAY_DB_PASSWORD" \
    -v recovery="$RECOVERY_DB_PASSWORD" <<'SQL'
CREATE ROLE runwire_submitter NOLOGIN;
CREATE ROLE runwire_executor NOLOGIN;
CREATE ROLE runwire_relay NOLOGIN;
CREATE ROLE runwire_recovery NOLOGIN;
CREATE ROLE rw_submitter LOGIN PASSWORD :'submitter' IN ROLE runwire_submitter;
CREATE ROLE rw_executor LOGIN PASSWORD :'executor' IN ROLE runwire_executor;
CREATE ROLE rw_relay LOGIN PASSWORD :'relay' IN ROLE runwire_relay;
CREATE ROLE rw_recovery LOGIN PASSWORD :'recovery' IN ROLE runwire_recovery;
SQL
