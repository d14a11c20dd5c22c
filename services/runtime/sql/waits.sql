-- Runs that wait (functions in functions/waits.sql): the executor's, the submitter's and
-- recovery's statements.

-- name: wait_begin
-- The attempt's wait, begun or found as decided: (state, value, timeout_at, waited_s).
SELECT o_state AS state, o_value AS value, o_timeout_at AS timeout_at, o_waited_s AS waited_s
  FROM wait_begin($1, $2, $3, $4, $5, $6, $7);

-- name: enter_waiting
-- The attempt ends to wait (or the run is queued, the wait decided meanwhile; or closed
-- by a cancel).
SELECT *, pg_current_xact_id()::text AS xact FROM enter_waiting($1, $2, $3, $4, $5, $6, $7, $8);

-- name: resume_run
SELECT resume_run($1, $2, $3, $4, $5, $6) AS result, pg_current_xact_id()::text AS xact;

-- name: signal_run
SELECT signal_run($1, $2, $3, $4, $5, $6) AS result, pg_current_xact_id()::text AS xact;

-- name: deliver_kept_signal
SELECT deliver_kept_signal($1, $2, $3) AS result, pg_current_xact_id()::text AS xact;

-- name: waiting_for
-- What a waiting run waits for: its wait not decided yet.
SELECT wait_id, kind, name, payload, timeout_at FROM run_waits
 WHERE run_id = $1 AND outcome IS NULL
 ORDER BY created_at DESC LIMIT 1;

-- name: time_out_waits
SELECT *, pg_current_xact_id()::text AS xact FROM time_out_waits($1, $2);
