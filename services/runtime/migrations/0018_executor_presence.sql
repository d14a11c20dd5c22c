-- An executor holds a session advisory lock while it lives (its presence), and each claim
-- records the lock's key. When the executor's process dies, Postgres ends its session and
-- frees the lock at once: recovery takes its runs over then, not when their leases run
-- out. A frozen executor keeps its session, and its runs wait for the lease as before.
ALTER TABLE runs ADD COLUMN lease_presence integer;
