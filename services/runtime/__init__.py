"""What every service shares: settings, the Postgres store, the NATS broker, logs, lifecycle."""
