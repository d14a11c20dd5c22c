-- A tenant's runs, newest first (`list`, and the console's run history), a page at a
-- time by submit_seq; node runs are listed under their workflow run, not here.
CREATE INDEX runs_by_tenant ON runs (tenant, submit_seq) WHERE parent_run_id IS NULL;
