-- The archiver hears each frame from the frames stream's live republish, with no consumer
-- of its own to remember how far it got: it keeps that here. Every frame the stream
-- stored at `archived_through` or before is in frame_segments (or was left out); the
-- relay that archives next reads the stream from there on. `stream_created` is when the
-- stream was made: a stream made anew numbers its frames from 1 again.
CREATE TABLE frame_archive (
    stream text PRIMARY KEY,
    stream_created text NOT NULL,
    archived_through bigint NOT NULL CHECK (archived_through >= 0)
);
GRANT SELECT, INSERT, UPDATE ON frame_archive TO runwire_relay;
