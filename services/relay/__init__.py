"""The relay: the frames stream archived into Postgres segments; `join`."""
