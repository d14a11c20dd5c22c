-- A waiting run is active (it holds its session, counts in quotas): the partial indexes
-- of active runs take it in, so that queries on run_active(status) still use them. (A
-- migration of its own: 0029 added the value, which its own transaction may not use.)
DROP INDEX runs_active_by_status;
CREATE INDEX runs_active_by_status ON runs (status, updated_at)
    WHERE status IN ('queued', 'running', 'recovering', 'waiting');
DROP INDEX runs_active_nodes;
CREATE INDEX runs_active_nodes ON runs (parent_run_id)
    WHERE parent_run_id IS NOT NULL AND status IN ('queued', 'running', 'recovering', 'waiting');
DROP INDEX runs_session_active;
CREATE INDEX runs_session_active ON runs (tenant, session_id, submit_seq)
    WHERE session_id IS NOT NULL AND status IN ('queued', 'running', 'recovering', 'waiting');
