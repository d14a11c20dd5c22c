-- Published outbox rows are deleted in run id order. A finishing batch of runs deletes
-- their job rows in run id order too (run_messages, one run after the other): deleted in
-- any other order, the two could each hold a row the other waits for, until Postgres
-- broke the circle a second later (deadlock_timeout) by failing one of them.
--
-- Taking rows in an order needs SELECT ... FOR UPDATE, which needs UPDATE on the table;
-- the services may only read and delete the outbox. So the deletion is a function with
-- the rights of its owner, that deletes nothing a service could not delete itself.
CREATE FUNCTION outbox_done(p_ids bigint[]) RETURNS void LANGUAGE sql AS $$
    DELETE FROM outbox
     WHERE id IN (SELECT id FROM outbox WHERE id = ANY(p_ids)
                   ORDER BY run_id, id
                     FOR UPDATE);
$$;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION outbox_done(bigint[]) SECURITY DEFINER SET search_path = %I, pg_temp',
                   current_schema());
END
$$;
REVOKE EXECUTE ON FUNCTION outbox_done(bigint[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox_done(bigint[]) TO
    runwire_submitter, runwire_executor, runwire_relay, runwire_recovery;
