-- Raw frames that cannot be forged. Each run gets a secret at insert (`frame_secret`,
-- from Postgres's strong random source; it never leaves the services). An attempt of
-- generation G signs its raw frames with `frame_token(secret, G)`, in the frame and in
-- its message id: an outsider can neither predict a real frame's message id (to have
-- JetStream drop the real one as a duplicate) nor make a frame the relay accepts. The
-- relay checks the token, and that Postgres has claimed the generation, before it
-- keeps a frame. Runs created before this migration have no secret: their frames are
-- taken as before.
ALTER TABLE runs ADD COLUMN frame_secret text;
ALTER TABLE runs ALTER COLUMN frame_secret SET DEFAULT gen_random_uuid()::text;

CREATE FUNCTION frame_token(p_secret text, p_generation integer) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT encode(sha256(convert_to(p_secret || ':' || p_generation, 'UTF8')), 'hex')
$$;

-- The closing frames a transition implies carry the token of their generation too.
CREATE OR REPLACE FUNCTION outbox_frame(r runs, p_generation integer, p_seq integer,
                                        p_type text, p_data jsonb)
RETURNS void LANGUAGE sql AS $$
    SELECT outbox_put('frame', r.tenant, r.run_id,
                      r.run_id || ':' || p_generation || ':' || p_seq
                          || coalesce(':' || left(frame_token(r.frame_secret, p_generation), 16),
                                      ''),
                      jsonb_build_object('v', 1, 'run_id', r.run_id, 'tenant', r.tenant,
                                         'generation', p_generation, 'seq', p_seq,
                                         'type', p_type, 'data', p_data,
                                         'at', rfc3339(clock_timestamp()))
                          || CASE WHEN r.frame_secret IS NULL THEN '{}'::jsonb
                                  ELSE jsonb_build_object(
                                      'token', frame_token(r.frame_secret, p_generation)) END,
                      coalesce(r.implied_trace_parent, r.trace_parent), now())
$$;
