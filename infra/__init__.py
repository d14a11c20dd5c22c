"""Local infrastructure: nats-server and Postgres from pip wheels, and the dev stack."""
