-- Signed completion webhooks: what a run's transition owes the tenant's endpoints.
-- The current definition of each function here: edit them in this file, never in a
-- migration (runwire.runtime.store.schema applies the files when they change).

-- A delivery to each of the tenant's endpoints that subscribe to `p_event` of run `r`
-- (a top-level run), written with the transition: its stable id (the same on every
-- retry, once per endpoint), its event and its body (runwire.contracts.webhooks).
CREATE OR REPLACE FUNCTION webhook_put(r runs, p_event text)
RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path TO 'public', 'pg_temp'
SET plan_cache_mode TO 'force_generic_plan' AS $$
    INSERT INTO webhook_deliveries (tenant, url, msg_id, event, body)
    SELECT r.tenant, e.url,
           'msg_' || replace(r.run_id::text, '-', '') || '_' || p_event || '_' || r.generation,
           p_event,
           jsonb_build_object(
               'type', 'run.' || p_event,
               'timestamp', rfc3339(clock_timestamp()),
               'data', jsonb_strip_nulls(jsonb_build_object(
                   'run_id', r.run_id, 'tenant', r.tenant, 'session_id', r.session_id,
                   'runner', r.runner, 'status', r.status, 'attempts', r.attempts,
                   'error', r.error, 'created_at', rfc3339(r.created_at),
                   'ended_at', rfc3339(r.ended_at))))
      FROM webhook_endpoints e
     WHERE e.tenant = r.tenant AND p_event = ANY(e.events)
    ON CONFLICT (url, msg_id) DO NOTHING
$$;
REVOKE ALL ON FUNCTION webhook_put(runs, text) FROM PUBLIC;

-- Replace a tenant's endpoints: `p_urls[i]` with the events of the JSON array
-- `p_events[i]`.
CREATE OR REPLACE FUNCTION set_webhook_endpoints(p_tenant text, p_urls text[],
    p_events text[])
RETURNS void LANGUAGE sql SET plan_cache_mode TO 'force_generic_plan' AS $$
    DELETE FROM webhook_endpoints WHERE tenant = p_tenant AND url <> ALL(p_urls);
    INSERT INTO webhook_endpoints (tenant, url, events)
    SELECT p_tenant, u.url, ARRAY(SELECT jsonb_array_elements_text(u.events::jsonb))
      FROM unnest(p_urls, p_events) AS u(url, events)
    ON CONFLICT (tenant, url) DO UPDATE SET events = EXCLUDED.events;
$$;
GRANT EXECUTE ON FUNCTION set_webhook_endpoints(text, text[], text[]) TO runwire_submitter;
