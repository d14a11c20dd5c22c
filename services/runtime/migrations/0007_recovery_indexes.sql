-- Recovery looks every tick for ended runs whose frames are not closed yet, and for ended
-- runs whose stream subject is not purged yet. Both are few at any time, but without an
-- index of their own each look scanned every run ended within the frame retention.

CREATE INDEX IF NOT EXISTS runs_unclosed ON runs (ended_at)
    WHERE ended_at IS NOT NULL AND NOT frames_closed;
CREATE INDEX IF NOT EXISTS runs_unpurged ON runs (ended_at)
    WHERE ended_at IS NOT NULL AND stream_purged_at IS NULL;
