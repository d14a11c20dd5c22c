-- Rate limits in requests and tokens per minute (migration 0040): each model call takes
-- a grant under every limit that applies to it before it is made, and settles it with
-- the tokens it used. A call that does not fit waits, its run queued without a slot,
-- first come first served: the calls waiting under a limit get their grants as soon as
-- room comes (a grant settled for less than it reserved, or time passing).
-- The current definition of each function here: edit them in this file, never in a
-- migration (runwire.runtime.store.schema applies the files when they change).

-- How long a grant counts: the provider's minute, and a second more, so that a call
-- that reaches the provider a little after its grant never meets, in the provider's
-- own minute, a call granted a minute later.
CREATE OR REPLACE FUNCTION rate_window()
RETURNS interval LANGUAGE sql IMMUTABLE AS $$ SELECT interval '61 seconds' $$;

-- A run that waits under a limit keeps its place while queued, or running (its time
-- came, and its attempt asks again).
CREATE OR REPLACE FUNCTION run_active_attempt(p_status run_status)
RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT p_status IN ('queued', 'running', 'recovering')
$$;

-- When the provider has room for `p_need` (tokens, or requests) by what it said at
-- `p_seen`: `p_left` of `p_limit`, full again at `p_reset`, refilled evenly meanwhile
-- (without its limit: at the reset); NULL when it has room now, or said nothing.
CREATE OR REPLACE FUNCTION provider_room(p_left integer, p_limit integer,
    p_seen timestamp with time zone, p_reset timestamp with time zone, p_need integer)
RETURNS timestamp with time zone LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_left IS NULL OR p_reset IS NULL OR p_reset <= now()
                     OR p_left >= p_need THEN NULL
                WHEN p_limit IS NULL OR p_limit <= p_left OR p_need > p_limit THEN p_reset
                ELSE p_seen + (p_reset - p_seen) * ((p_need - p_left)::float8 / (p_limit - p_left))
           END
$$;

-- The soonest time a call of `p_tokens` tokens (and `p_requests` requests: the call and
-- those waiting ahead of it) fits under limit `l`: now when it fits now, 'infinity'
-- when it never does (more than the limit itself).
CREATE OR REPLACE FUNCTION rate_room(l rate_limits, p_tokens bigint, p_requests bigint,
    p_own_tokens integer)
RETURNS timestamp with time zone LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path TO 'public', 'pg_temp' SET plan_cache_mode TO 'force_generic_plan' AS $$
DECLARE
    v_at timestamp with time zone := now();
    v_used bigint;
    v_count bigint;
    v_tokens bigint;
    v_requests bigint;
    g record;
BEGIN
    IF l.tpm IS NOT NULL AND p_own_tokens > l.tpm THEN
        RETURN 'infinity';
    END IF;
    -- What the provider said last.
    IF l.blocked_until > v_at THEN
        v_at := l.blocked_until;
    END IF;
    v_at := greatest(v_at, provider_room(l.tokens_left, l.tokens_limit, l.observed_at,
                                         l.tokens_reset_at, p_own_tokens),
                     provider_room(l.requests_left, l.requests_limit, l.observed_at,
                                   l.requests_reset_at, 1));
    -- The grants of the last minute: enough of them must leave it first.
    SELECT coalesce(sum(tokens), 0), count(*) INTO v_used, v_count
      FROM rate_grants WHERE key = l.key AND at > now() - rate_window();
    v_tokens := CASE WHEN l.tpm IS NULL THEN 0 ELSE v_used + p_tokens - l.tpm END;
    v_requests := CASE WHEN l.rpm IS NULL THEN 0 ELSE v_count + p_requests - l.rpm END;
    IF v_tokens <= 0 AND v_requests <= 0 THEN
        RETURN v_at;
    END IF;
    FOR g IN SELECT tokens, at FROM rate_grants
              WHERE key = l.key AND at > now() - rate_window() ORDER BY at LOOP
        v_tokens := v_tokens - g.tokens;
        v_requests := v_requests - 1;
        IF v_tokens <= 0 AND v_requests <= 0 THEN
            RETURN greatest(v_at, g.at + rate_window());
        END IF;
    END LOOP;
    -- Those waiting ahead need more than the window holds: a window later at least.
    RETURN greatest(v_at, now() + rate_window());
END
$$;
REVOKE ALL ON FUNCTION rate_room(rate_limits, bigint, bigint, integer) FROM PUBLIC;

-- Grant the call `p_call` of run `p_run` its `p_tokens` under the limits `p_keys`.
CREATE OR REPLACE FUNCTION rate_grant(p_keys text[], p_run uuid, p_call text, p_tokens integer)
RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path TO 'public', 'pg_temp' AS $$
    INSERT INTO rate_grants (key, run_id, call, tokens)
    SELECT key, p_run, p_call, p_tokens FROM rate_limits WHERE key = ANY(p_keys);
    UPDATE rate_limits
       SET tokens_left = CASE WHEN tokens_reset_at > now() THEN tokens_left - p_tokens
                              ELSE tokens_left END,
           requests_left = CASE WHEN requests_reset_at > now() THEN requests_left - 1
                                ELSE requests_left END
     WHERE key = ANY(p_keys);
    DELETE FROM rate_waiters WHERE run_id = p_run;
$$;
REVOKE ALL ON FUNCTION rate_grant(text[], uuid, text, integer) FROM PUBLIC;

-- The soonest time run `p_run`'s call fits under every limit of `p_keys`, behind the
-- calls waiting ahead of it (all of them, for a run that is not waiting yet); and the
-- limit that holds it longest.
CREATE OR REPLACE FUNCTION rate_fit(p_keys text[], p_run uuid, p_tokens integer,
    OUT o_at timestamp with time zone, OUT o_key text)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path TO 'public', 'pg_temp'
SET plan_cache_mode TO 'force_generic_plan' AS $$
DECLARE
    l rate_limits;
    v_since timestamp with time zone;
    v_ahead_tokens bigint;
    v_ahead bigint;
    v_at timestamp with time zone;
BEGIN
    o_at := now();
    SELECT since INTO v_since FROM rate_waiters WHERE run_id = p_run;
    FOR l IN SELECT * FROM rate_limits WHERE key = ANY(p_keys) ORDER BY key LOOP
        SELECT coalesce(sum(w.tokens), 0), count(*) INTO v_ahead_tokens, v_ahead
          FROM rate_waiters w JOIN runs r ON r.run_id = w.run_id AND run_active_attempt(r.status)
         WHERE l.key = ANY(w.keys) AND w.run_id <> p_run
           AND (v_since IS NULL OR w.since < v_since);
        v_at := rate_room(l, v_ahead_tokens + p_tokens, v_ahead + 1, p_tokens);
        IF v_at > o_at THEN
            o_at := v_at;
            o_key := l.key;
        END IF;
    END LOOP;
END
$$;
REVOKE ALL ON FUNCTION rate_fit(text[], uuid, integer) FROM PUBLIC;

-- The calls waiting under the limits `p_keys`, first come first served, that fit now
-- get their grants, and their runs their jobs at once; returns how many. The first that
-- does not fit stops the others (none overtakes it). A waiter whose run ended (canceled
-- meanwhile) is dropped; one whose run is running (its time came) keeps its place.
CREATE OR REPLACE FUNCTION rate_serve_waiters(p_keys text[], p_actor text)
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path TO 'public', 'pg_temp'
SET plan_cache_mode TO 'force_generic_plan' AS $$
DECLARE
    v_w rate_waiters;
    v_fit record;
    v_served integer := 0;
BEGIN
    DELETE FROM rate_waiters w WHERE w.keys && p_keys AND NOT EXISTS (
        SELECT 1 FROM runs r WHERE r.run_id = w.run_id AND run_active_attempt(r.status));
    -- Only those whose every limit is among `p_keys` (locked by the caller): a waiter
    -- under a limit not locked here is served by that limit's next caller.
    FOR v_w IN SELECT * FROM rate_waiters WHERE keys <@ p_keys ORDER BY since LOOP
        SELECT * INTO v_fit FROM rate_fit(v_w.keys, v_w.run_id, v_w.tokens);
        EXIT WHEN v_fit.o_at > now();
        PERFORM rate_grant(v_w.keys, v_w.run_id, v_w.call, v_w.tokens);
        WITH upd AS (
            UPDATE runs SET not_before = now(), job_published_at = now(), limit_key = NULL,
                            updated_at = now()
             WHERE run_id = v_w.run_id AND status = 'queued' AND limit_key IS NOT NULL
            RETURNING *
        )
        INSERT INTO run_events (run_id, event, status, attempt, actor, reason)
        SELECT run_id, 'rate_granted', status, attempts, p_actor,
               'room under its rate limits for ' || v_w.call FROM upd;
        v_served := v_served + 1;
    END LOOP;
    RETURN v_served;
END
$$;
REVOKE ALL ON FUNCTION rate_serve_waiters(text[], text) FROM PUBLIC;

-- Take a grant for call `p_call` of run `p_run` (`p_tokens` tokens and one request)
-- under every limit of `p_keys` that is set (none set: granted). A grant made for this
-- call already and not settled is this call's (made while the run waited, or to an
-- attempt that did not make the call). Otherwise the call is granted when it fits now
-- and no call waits ahead of it; else the run waits for it: `o_granted` false, `o_at`
-- the soonest time it may fit (NULL: never, it needs more than the limit), `o_key` the
-- limit that holds it. `o_limited`: whether any limit of `p_keys` is set.
-- Its signature before it told how many waiting runs it served:
DROP FUNCTION IF EXISTS rate_reserve(text[], uuid, text, integer, text);
CREATE OR REPLACE FUNCTION rate_reserve(p_keys text[], p_run uuid, p_call text,
    p_tokens integer, p_actor text,
    OUT o_granted boolean, OUT o_at timestamp with time zone, OUT o_key text,
    OUT o_limited boolean, OUT o_served integer)
LANGUAGE plpgsql SECURITY DEFINER SET search_path TO 'public', 'pg_temp'
SET plan_cache_mode TO 'force_generic_plan' AS $$
DECLARE
    v_keys text[];
BEGIN
    o_served := 0;
    -- One caller at a time per limit: the rows locked in key order.
    SELECT array_agg(key ORDER BY key) INTO v_keys
      FROM (SELECT key FROM rate_limits WHERE key = ANY(p_keys) ORDER BY key FOR UPDATE) l;
    o_granted := true;
    o_limited := v_keys IS NOT NULL;
    IF v_keys IS NULL THEN
        RETURN;
    END IF;
    DELETE FROM rate_grants WHERE key = ANY(v_keys) AND at < now() - 2 * rate_window();
    o_served := rate_serve_waiters(v_keys, p_actor);
    IF EXISTS (SELECT 1 FROM rate_grants
                WHERE run_id = p_run AND call = p_call AND NOT settled
                  AND at > now() - rate_window()) THEN
        -- Made earlier; while the provider asks every call to wait, this one waits too.
        SELECT blocked_until, key INTO o_at, o_key FROM rate_limits
         WHERE key = ANY(v_keys) AND blocked_until > now()
         ORDER BY blocked_until DESC LIMIT 1;
        IF FOUND THEN
            o_granted := false;
            INSERT INTO rate_waiters (run_id, call, keys, tokens)
            VALUES (p_run, p_call, v_keys, p_tokens)
            ON CONFLICT (run_id) DO UPDATE SET call = EXCLUDED.call, keys = EXCLUDED.keys;
            RETURN;
        END IF;
        -- The call is made now: it counts for a minute from now.
        UPDATE rate_grants SET at = now()
         WHERE run_id = p_run AND call = p_call AND NOT settled;
        DELETE FROM rate_waiters WHERE run_id = p_run;
        RETURN;
    END IF;
    SELECT f.o_at, f.o_key INTO o_at, o_key FROM rate_fit(v_keys, p_run, p_tokens) f;
    IF o_at <= now() THEN
        PERFORM rate_grant(v_keys, p_run, p_call, p_tokens);
        o_at := NULL;
        o_key := NULL;
        RETURN;
    END IF;
    o_granted := false;
    IF o_at = 'infinity' THEN
        o_at := NULL;
    ELSE
        INSERT INTO rate_waiters (run_id, call, keys, tokens)
        VALUES (p_run, p_call, v_keys, p_tokens)
        ON CONFLICT (run_id) DO UPDATE
           SET call = EXCLUDED.call, keys = EXCLUDED.keys, tokens = EXCLUDED.tokens;
    END IF;
END
$$;
REVOKE ALL ON FUNCTION rate_reserve(text[], uuid, text, integer, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION rate_reserve(text[], uuid, text, integer, text) TO runwire_executor;

-- Whether run `p_run` holds a grant it has not used yet (made while it waited, maybe
-- while its attempt was still ending).
CREATE OR REPLACE FUNCTION rate_granted_run(p_run uuid)
RETURNS boolean LANGUAGE sql STABLE SECURITY DEFINER SET search_path TO 'public', 'pg_temp' AS $$
    SELECT EXISTS (SELECT 1 FROM rate_grants
                    WHERE run_id = p_run AND NOT settled AND at > now() - rate_window())
$$;
REVOKE ALL ON FUNCTION rate_granted_run(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION rate_granted_run(uuid) TO runwire_executor;

-- Settle call `p_call` of run `p_run` with the tokens it used (what it reserved counts
-- no more); the calls waiting under its limits that fit now get their grants. Returns
-- how many runs got theirs (their jobs are in this transaction's outbox).
CREATE OR REPLACE FUNCTION rate_settle(p_run uuid, p_call text, p_tokens integer,
    p_actor text)
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path TO 'public', 'pg_temp'
SET plan_cache_mode TO 'force_generic_plan' AS $$
DECLARE
    v_keys text[];
BEGIN
    SELECT array_agg(key ORDER BY key) INTO v_keys FROM rate_grants
     WHERE run_id = p_run AND call = p_call AND NOT settled;
    IF v_keys IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM 1 FROM rate_limits WHERE key = ANY(v_keys) ORDER BY key FOR UPDATE;
    UPDATE rate_grants SET tokens = greatest(p_tokens, 0), settled = true
     WHERE run_id = p_run AND call = p_call AND NOT settled;
    RETURN rate_serve_waiters(v_keys, p_actor);
END
$$;
REVOKE ALL ON FUNCTION rate_settle(uuid, text, integer, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION rate_settle(uuid, text, integer, text) TO runwire_executor;

-- What the provider said about the most specific of the limits `p_keys` that is set (a
-- model's, before its provider key's: a provider limits each model apart), in seconds
-- from now (one row locked: never in an order against rate_reserve's):
-- `retry_after_s` (a 429: no call before then); `tokens_left` of `tokens_limit`, full
-- again in `tokens_reset_s`, and the same of requests (its rate-limit headers). What it
-- did not say is kept.
CREATE OR REPLACE FUNCTION rate_observe(p_keys text[], p_said jsonb)
RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path TO 'public', 'pg_temp' AS $$
    UPDATE rate_limits
       SET blocked_until = greatest(blocked_until, now() + make_interval(
               secs => (p_said->>'retry_after_s')::float8)),
           observed_at = CASE WHEN p_said ? 'tokens_left' OR p_said ? 'requests_left'
                              THEN now() ELSE observed_at END,
           tokens_left = coalesce((p_said->>'tokens_left')::numeric::integer, tokens_left),
           tokens_limit = CASE WHEN p_said ? 'tokens_left'
                               THEN (p_said->>'tokens_limit')::numeric::integer ELSE tokens_limit END,
           tokens_reset_at = CASE WHEN p_said ? 'tokens_left' THEN now() + make_interval(
                                      secs => (p_said->>'tokens_reset_s')::float8)
                                  ELSE tokens_reset_at END,
           requests_left = coalesce((p_said->>'requests_left')::numeric::integer, requests_left),
           requests_limit = CASE WHEN p_said ? 'requests_left'
                                 THEN (p_said->>'requests_limit')::numeric::integer
                                 ELSE requests_limit END,
           requests_reset_at = CASE WHEN p_said ? 'requests_left' THEN now() + make_interval(
                                        secs => (p_said->>'requests_reset_s')::float8)
                                    ELSE requests_reset_at END,
           updated_at = now()
     WHERE key = (SELECT key FROM rate_limits WHERE key = ANY(p_keys)
                   ORDER BY length(key) DESC, key LIMIT 1);
$$;
REVOKE ALL ON FUNCTION rate_observe(text[], jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION rate_observe(text[], jsonb) TO runwire_executor;
