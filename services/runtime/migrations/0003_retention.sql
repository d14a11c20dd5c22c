-- Frame retention: when a run's subject left the stream and when its segments expired.

ALTER TABLE runs ADD COLUMN stream_purged_at timestamptz;
ALTER TABLE runs ADD COLUMN frames_expired_at timestamptz;

CREATE INDEX runs_ended_frames ON runs (ended_at)
    WHERE ended_at IS NOT NULL AND frames_expired_at IS NULL;
