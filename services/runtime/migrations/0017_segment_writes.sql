-- Two relays may flush frames of one run at once: one that lost its partition (after a
-- freeze) and its new owner, which repairs what is missing from the stream. Each flush
-- leaves out a segment that overlaps one already written, but a statement cannot see a
-- segment that a concurrent one has not committed yet, so both could be written and the
-- run's frames counted, and replayed, twice. A flush now first locks its runs (in one
-- order, so two flushes never deadlock), and only then, with a fresh snapshot, looks for
-- the segments already there: writes of one run's segments happen one at a time.
CREATE FUNCTION write_segments(
    p_runs uuid[], p_first bigint[], p_last bigint[], p_last_stream bigint[],
    p_frames text[], p_closed boolean[]
) RETURNS TABLE (run_id uuid, tenant text, last_seq bigint, frame_count bigint,
                 done_written boolean)
LANGUAGE sql VOLATILE AS $$
    SELECT 1 FROM runs WHERE runs.run_id = ANY(p_runs) ORDER BY runs.run_id FOR NO KEY UPDATE;

    WITH ins AS (
        INSERT INTO frame_segments (run_id, first_seq, last_seq, last_stream_seq, frames)
        SELECT s.run_id, s.first_seq, s.last_seq, s.last_stream_seq, s.frames::jsonb
          FROM unnest(p_runs, p_first, p_last, p_last_stream, p_frames)
               AS s(run_id, first_seq, last_seq, last_stream_seq, frames)
         -- Segments never overlap, so that frame_count counts each frame once: one that
         -- overlaps a segment already written is left out; what it alone held is
         -- repaired from the stream. Segments are disjoint, so the one starting last at
         -- or before this one's end is the only one that can overlap it.
         WHERE coalesce((SELECT f.last_seq FROM frame_segments f
                          WHERE f.run_id = s.run_id AND f.first_seq <= s.last_seq
                          ORDER BY f.first_seq DESC LIMIT 1), 0) < s.first_seq
        ON CONFLICT ON CONSTRAINT frame_segments_pkey DO NOTHING
        RETURNING frame_segments.run_id, frame_segments.last_seq,
                  jsonb_array_length(frame_segments.frames) AS n
    ), per_run AS (
        SELECT i.run_id, max(i.last_seq) AS last_seq, sum(i.n) AS n, bool_or(u.closed) AS closed
          FROM ins i
          JOIN unnest(p_runs, p_last, p_closed) AS u(run_id, last_seq, closed)
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
    RETURNING r.run_id, r.tenant, r.last_seq, r.frame_count, p.closed;
$$;
REVOKE EXECUTE ON FUNCTION write_segments(uuid[], bigint[], bigint[], bigint[], text[], boolean[])
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION write_segments(uuid[], bigint[], bigint[], bigint[], text[], boolean[])
    TO runwire_relay;
