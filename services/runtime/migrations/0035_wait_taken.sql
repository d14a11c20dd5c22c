-- The attempt that first found a wait decided (and observed how long it lasted).
ALTER TABLE run_waits ADD COLUMN taken_generation integer;
