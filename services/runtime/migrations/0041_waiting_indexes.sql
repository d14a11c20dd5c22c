-- The runs waiting for their job (for their tenant's share, their session or their
-- key), indexed apart from the queued runs that have one: the next turn is found
-- without stepping over the runs already issued, and a run that gets its job at submit
-- (the common case) is never written to these indexes.
CREATE INDEX runs_waiting_by_tenant ON runs (tenant, submit_seq)
 WHERE status = 'queued' AND parent_run_id IS NULL AND job_published_at IS NULL;
DROP INDEX runs_queued_by_priority;
CREATE INDEX runs_waiting_by_priority ON runs (tenant, priority DESC, submit_seq)
 WHERE status = 'queued' AND parent_run_id IS NULL AND job_published_at IS NULL;
