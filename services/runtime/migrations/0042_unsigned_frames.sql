-- One store per frame: attempts publish each frame once, straight to the frames stream,
-- and only services may publish there (the broker refuses tenants), so frames are no
-- longer signed. A new run gets no secret (the column stays for runs made before, and
-- for a service of an earlier version still draining).
ALTER TABLE runs ALTER COLUMN frame_secret DROP DEFAULT;
