-- The relay's queries: where a run's frames stand, segments, and its partition locks.
-- Named queries: `-- name: <name>` starts one.

-- name: insert_segments
-- One write per relay flush: every run's new segments, and the runs' frame counters
-- (counting only segments actually inserted, so a repeated flush counts nothing twice;
-- `write_segments` writes one run's segments one flush at a time).
SELECT * FROM write_segments($1::uuid[], $2::bigint[], $3::bigint[], $4::bigint[],
                             $5::text[], $6::boolean[]);

-- name: segment_texts_after
-- The first $3 segments after a cursor with their frames as JSON text: a join places
-- them into its reply as they are (and asks for more while its reply has room).
-- (Chosen first, made text after: Postgres would make every segment after the cursor
-- text before it sorts and limits them.)
SELECT first_seq, last_seq, last_stream_seq, frames::text AS frames
  FROM (SELECT first_seq, last_seq, last_stream_seq, frames
          FROM frame_segments
         WHERE run_id = $1 AND last_seq > $2
         ORDER BY first_seq
         LIMIT $3) AS chosen
 ORDER BY first_seq;

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

-- name: archived_through
-- How far the frames stream is archived, and when the stream archived was made (see
-- frame_archive).
SELECT stream_created, archived_through FROM frame_archive WHERE stream = $1;

-- name: advance_archive
-- Never back, and only for the stream made at $2: a relay that wakes from a freeze
-- after another took over says only how far its own writes went.
INSERT INTO frame_archive AS a (stream, stream_created, archived_through)
VALUES ($1, $2, $3)
    ON CONFLICT (stream) DO UPDATE
   SET archived_through = greatest(a.archived_through, excluded.archived_through)
 WHERE a.stream_created = excluded.stream_created;

-- name: restart_archive
-- Archived from $3 on: the stream made at $2 (made anew, or first archived here).
INSERT INTO frame_archive (stream, stream_created, archived_through) VALUES ($1, $2, $3)
    ON CONFLICT (stream) DO UPDATE
   SET stream_created = excluded.stream_created,
       archived_through = excluded.archived_through;

-- name: lock_try
-- Session advisory locks (per database) on a dedicated connection: relay partitions,
-- relay presence and executor presence. Released by unlock, or when the connection ends.
SELECT pg_try_advisory_lock($1::integer, $2::integer) AS locked;

-- name: lock_ping
-- The lock session is still there (its locks held).
SELECT 1 AS alive;

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
