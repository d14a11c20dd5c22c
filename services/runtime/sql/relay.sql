-- The relay's queries: where a run's frames stand, segments, and its partition locks.
-- Named queries: `-- name: <name>` starts one.

-- name: frame_states
-- The relay's starting point for runs it has no cursor for, and what tells their real
-- frames from forged ones (their secret, the generation last claimed, whether they ended).
SELECT run_id, last_seq, frames_closed, frame_secret, generation, run_terminal(status) AS ended
  FROM runs WHERE run_id = ANY($1::uuid[]);

-- name: insert_segments
-- One write per relay flush: every run's new segments, and the runs' frame counters
-- (counting only segments actually inserted, so a repeated flush counts nothing twice).
WITH ins AS (
    INSERT INTO frame_segments (run_id, first_seq, last_seq, last_stream_seq, frames)
    SELECT s.run_id, s.first_seq, s.last_seq, s.last_stream_seq, s.frames::jsonb
      FROM unnest($1::uuid[], $2::bigint[], $3::bigint[], $4::bigint[], $5::text[])
           AS s(run_id, first_seq, last_seq, last_stream_seq, frames)
     -- Segments never overlap, so that frame_count counts each frame once: a segment
     -- that overlaps one already written (a relay that lost its partition flushing
     -- frames the new owner repaired) is left out; what it alone held is repaired
     -- from the stream. Segments are disjoint, so the one starting last at or before
     -- this one's end is the only one that can overlap it.
     WHERE coalesce((SELECT f.last_seq FROM frame_segments f
                      WHERE f.run_id = s.run_id AND f.first_seq <= s.last_seq
                      ORDER BY f.first_seq DESC LIMIT 1), 0) < s.first_seq
    ON CONFLICT (run_id, first_seq) DO NOTHING
    RETURNING run_id, last_seq, jsonb_array_length(frames) AS n
), per_run AS (
    SELECT i.run_id, max(i.last_seq) AS last_seq, sum(i.n) AS n, bool_or(u.closed) AS closed
      FROM ins i
      JOIN unnest($1::uuid[], $3::bigint[], $6::boolean[]) AS u(run_id, last_seq, closed)
        ON u.run_id = i.run_id AND u.last_seq = i.last_seq
     GROUP BY i.run_id
)
-- A run's frames are closed once `done` was written and no frame is missing.
UPDATE runs r
   SET last_seq = GREATEST(r.last_seq, p.last_seq),
       frame_count = r.frame_count + p.n,
       frames_closed = r.frames_closed
           OR (p.closed AND r.frame_count + p.n >= GREATEST(r.last_seq, p.last_seq))
  FROM per_run p
 WHERE r.run_id = p.run_id
RETURNING r.run_id, r.tenant, r.last_seq, r.frame_count, p.closed AS done_written;

-- name: segments_after
-- `size`: the segment's frames as JSON text, in bytes (for the join's reply limit).
SELECT first_seq, last_seq, last_stream_seq, frames, octet_length(frames::text) AS size
  FROM frame_segments
 WHERE run_id = $1 AND last_seq > $2
 ORDER BY first_seq;

-- name: segment_ranges
-- What a run's segments cover, without their frames (for finding missing ones).
SELECT first_seq, last_seq, last_stream_seq FROM frame_segments
 WHERE run_id = $1 ORDER BY first_seq;

-- name: last_segment
SELECT last_seq, last_stream_seq FROM frame_segments
 WHERE run_id = $1 ORDER BY first_seq DESC LIMIT 1;

-- name: mark_frames_closed
-- A run whose missing frames can no longer be found: stop asking for its closing frames.
UPDATE runs SET frames_closed = true WHERE run_id = $1;

-- name: lock_try
-- Session advisory locks (per database) on a dedicated connection: relay partitions
-- and relay presence. Released by unlock, or when the connection ends.
SELECT pg_try_advisory_lock($1::integer, $2::integer) AS locked;

-- name: lock_release
SELECT pg_advisory_unlock($1::integer, $2::integer) AS released;

-- name: lock_idle_timeout
-- Postgres ends this session (and so frees its locks) once it has been idle this long
-- (milliseconds): a relay that is frozen or cut off stops holding its partitions.
SELECT set_config('idle_session_timeout', $1, false) AS timeout;

-- name: lock_holders
-- How many sessions of this database hold a lock of one class (live relays).
SELECT count(DISTINCT pid) AS holders FROM pg_locks
 WHERE locktype = 'advisory' AND granted AND classid = $1::integer::oid
   AND database = (SELECT oid FROM pg_database WHERE datname = current_database());
