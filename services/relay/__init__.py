"""The relay: raw frames → ordered client frames and Postgres segments; `join`."""
