"""The Postgres schema: statuses agree with the contract; migrations are safe to re-run."""

import asyncio
import json
import re
import uuid
from pathlib import Path

import asyncpg
import pytest

import runwire.runtime
from runwire.contracts.events import RunEventName
from runwire.contracts.status import RunStatus
from runwire.runtime.errors import (
    CANCELED_ERROR,
    LostRace,
    MigrationFailed,
    QuotaExceeded,
    StoreError,
)
from runwire.runtime.store import OutboxKind, Run, Segment, Store, migrate
from runwire.runtime.store.schema import QUERIES
from runwire.testing.servers import Servers
from runwire.testing.waiting import eventually

pytestmark = pytest.mark.integration


async def test_run_status_enum_matches_the_contract(db_url: str) -> None:
    store = await Store.connect(db_url, pool_size=1)
    try:
        assert await store.run_status_values() == [s.value for s in RunStatus]
    finally:
        await store.close()


async def test_status_sets_of_the_queries_match_the_contract(db_url: str) -> None:
    """run_active / run_awaits_attempt / run_terminal, which every query uses, say what
    RunStatus says."""
    conn = await asyncpg.connect(db_url)
    try:
        for status in RunStatus:
            row = await conn.fetchrow(
                "SELECT run_active($1::run_status) AS active,"
                " run_awaits_attempt($1::run_status) AS waiting,"
                " run_terminal($1::run_status) AS terminal",
                status.value,
            )
            assert row is not None
            assert row["terminal"] is status.terminal, status
            assert row["active"] is (not status.terminal), status
            assert row["waiting"] is (status in (RunStatus.QUEUED, RunStatus.RECOVERING)), status
    finally:
        await conn.close()


async def test_event_names_and_outbox_kinds_match_their_definitions(db_url: str) -> None:
    """The CHECK on run_events.event lists the contract's event names, and the
    `outbox_kind` enum the kinds the outbox publishes; an unknown event is refused."""
    conn = await asyncpg.connect(db_url)
    try:
        check = await conn.fetchval(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conname = 'run_events_event_known'"
        )
        kinds = await conn.fetch(
            "SELECT enumlabel FROM pg_enum e JOIN pg_type t ON t.oid = e.enumtypid"
            " WHERE t.typname = 'outbox_kind' ORDER BY e.enumsortorder"
        )
        run_id = uuid.uuid4()
        await conn.execute(
            "INSERT INTO runs (run_id, tenant, request_id, multitask, runner, input,"
            " max_attempts, attempt_timeout_ms) VALUES ($1, 't', 'r', 'interrupt',"
            " 'scripted', '{}', 1, 1000)",
            run_id,
        )
        with pytest.raises(asyncpg.CheckViolationError):
            await conn.execute(
                "INSERT INTO run_events (run_id, event, status, attempt, actor)"
                " VALUES ($1, 'due', 'queued', 0, 'test')",
                run_id,
            )
    finally:
        await conn.close()
    assert sorted(re.findall(r"'(\w+)'", check)) == sorted(e.value for e in RunEventName)
    assert [r["enumlabel"] for r in kinds] == [k.value for k in OutboxKind]


async def _schema(url: str) -> list[tuple[str, str, str, str]]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT table_name, column_name, data_type, is_nullable"
            " FROM information_schema.columns WHERE table_schema = 'public'"
            " ORDER BY table_name, column_name"
        )
    finally:
        await conn.close()
    return [tuple(r) for r in rows]


async def test_fresh_and_migrated_databases_have_the_same_schema(
    infra: Servers, db_url: str
) -> None:
    # db_url was copied from the template migrated at session start; run migrate again
    # (a restart of a service) and on an empty database, and compare.
    assert await migrate(db_url) == []
    name = "fresh_" + db_url.rsplit("/", 1)[1]
    conn = await asyncpg.connect(infra.admin_url)
    await conn.execute(f'CREATE DATABASE "{name}"')
    await conn.close()
    try:
        fresh = infra.database_url(name)
        folder = Path(runwire.runtime.__file__).parent / "migrations"
        migrations = sorted(p.name for p in folder.glob("*.sql"))
        assert await migrate(fresh) == [*migrations, "sql/functions"]
        assert await _schema(fresh) == await _schema(db_url)
    finally:
        await infra.drop_database(name)


async def test_every_named_query_prepares(db_url: str) -> None:
    """Catches a query whose parameters or columns do not fit the schema."""
    from runwire.runtime.store import QUERIES

    conn = await asyncpg.connect(db_url)
    try:
        for name, sql in QUERIES.items():
            try:
                await conn.prepare(sql)
            except asyncpg.PostgresError as exc:
                pytest.fail(f"query {name} does not prepare: {exc}")
    finally:
        await conn.close()


async def test_a_burst_of_work_finds_every_connection_open_and_knowing_the_types(
    db_url: str,
) -> None:
    """A service opens all its Postgres connections as it starts and keeps them, each
    knowing runwire's types: a burst of work (the first after a start, or after a quiet
    while) waits for no connection to be opened, and no statement for its types to be
    looked up in Postgres (milliseconds each, in the middle of runs' starts)."""
    backends = (
        "SELECT array_agg(pid ORDER BY pid) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        " AND backend_type = 'client backend'"
    )
    store = await Store.connect(db_url, pool_size=3)
    admin = await asyncpg.connect(db_url)
    held: list[asyncpg.pool.PoolConnectionProxy] = []
    try:
        opened = await admin.fetchval(backends)
        assert len(opened) == 3, "every connection is open before any work"
        lookups: list[str] = []
        # The burst: every connection of the pool busy at once, each preparing every
        # statement that runwire sends.
        held = [await store._pool.acquire() for _ in range(3)]
        for conn in held:
            conn.add_query_logger(lambda logged: lookups.append(logged.query))

        async def prepare_all(conn: asyncpg.pool.PoolConnectionProxy) -> None:
            for sql in QUERIES.values():
                await conn.prepare(sql)

        await asyncio.gather(*(prepare_all(conn) for conn in held))
        assert lookups == [], f"types looked up in Postgres: {lookups[:1]}"
        assert await admin.fetchval(backends) == opened, "no connection opened or closed"
    finally:
        for conn in held:
            await store._pool.release(conn)
        await admin.close()
        await store.close()


@pytest.mark.parametrize(
    ("query", "args"),
    [("purge_due", (600.0, 500)), ("outbox_due", (2000, 500))],
)
async def test_recovery_looks_do_not_grow_with_the_history_of_ended_runs(
    db_url: str, query: str, args: tuple[object, ...]
) -> None:
    """Every recovery tick looks for unclosed and unpurged runs: with 20,000 runs ended,
    closed and purged, that look reads a handful of pages, not the history."""
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute(
            """
            INSERT INTO runs (run_id, tenant, request_id, multitask, runner, input,
                              max_attempts, attempt_timeout_ms, status, ended_at,
                              frames_closed, last_seq, frame_count, stream_purged_at)
            SELECT gen_random_uuid(), 'default', 'old-' || g, 'interrupt', 'scripted',
                   '{}'::jsonb, 3, 1000, 'finished', now() - make_interval(secs => g),
                   true, 3, 3, now() - make_interval(secs => g) + interval '1 minute'
              FROM generate_series(1, 20000) g
            """
        )
        await conn.execute("ANALYZE runs")
        plan = await conn.fetchval(
            f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {QUERIES[query]}", *args
        )
    finally:
        await conn.close()
    root = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
    pages = root["Shared Hit Blocks"] + root["Shared Read Blocks"]
    assert pages < 50, f"{query} read {pages} pages"


async def test_a_migration_that_fails_stops_the_start_at_once_and_says_which(db_url: str) -> None:
    # The record of migration 6 is lost: applying it again finds its column there.
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute("DELETE FROM schema_migrations WHERE version = 6")
    finally:
        await conn.close()
    with pytest.raises(MigrationFailed, match=r"0006_trace_parent\.sql failed.*trace_parent"):
        await Store.connect(db_url, timeout=60)


async def _insert(
    store: Store, request_id: str, *, session_id: str | None = None, multitask: str = "interrupt"
) -> Run:
    """A queued scripted run of the default tenant, as the submitter writes one."""
    run = await store.insert_run(
        run_id=str(uuid.uuid4()),
        tenant="default",
        request_id=request_id,
        session_id=session_id,
        multitask=multitask,
        runner="scripted",
        input={"tokens": ["x"]},
        metadata={},
        max_attempts=3,
        attempt_timeout_ms=1000,
        queue_timeout_ms=None,
        actor="test",
    )
    assert run is not None
    return run


async def _waiting_for_a_lock(conn: asyncpg.Connection, query: str = "%") -> bool:
    """Whether another session's statement (like `query`) waits for a lock. (Inside a
    transaction Postgres shows the sessions as it first saw them: look afresh each time.)"""
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    return bool(
        await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND pid <> pg_backend_pid() AND query LIKE $1",
            query,
        )
    )


async def test_one_replica_at_a_time_sweeps_the_outbox(db_url: str) -> None:
    """Two recovery replicas publishing disjoint batches at once could put a run's later
    event in the stream first: while one holds the outbox, the other gets nothing."""
    store = await Store.connect(db_url, pool_size=3)
    try:
        for i in range(3):
            await _insert(store, f"r-{i}")
        async with store.outbox_due(0, 1) as first:
            # At most one of each: the oldest job (an outbox row) and the oldest event.
            assert sorted(m.kind for m in first.messages) == ["event", "job"]
            first.published.extend(first.messages)
            async with store.outbox_due(0, 10) as meanwhile:
                assert meanwhile.messages == []
        async with store.outbox_due(0, 10) as rest:
            # The other runs' jobs and events, each kind oldest first, after the first ones
            # (those were published: deleted, or marked published).
            assert sorted(m.kind for m in rest.messages) == ["event"] * 2 + ["job"] * 2
            for kind in ("event", "job"):
                ids = [m.id for m in rest.messages if m.kind == kind]
                (earlier,) = [m.id for m in first.messages if m.kind == kind]
                assert ids == sorted(ids)
                assert ids[0] > earlier
    finally:
        await store.close()


async def test_a_statement_rolled_back_to_break_a_deadlock_runs_again(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = await Store.connect(db_url, pool_size=2)
    other = await asyncpg.connect(db_url)
    try:
        runs = []
        for i in range(2):
            run = await _insert(store, f"d-{i}", session_id="s", multitask="enqueue")
            runs.append(uuid.UUID(run.run_id))
        first, second = runs
        # Another transaction holds the second run; the store's statement (both runs of
        # the session, in their order) takes the first and waits for the second.
        await other.execute("SET deadlock_timeout = '10s'")  # the store's side gives way
        tx = other.transaction()
        await tx.start()
        await other.execute("UPDATE runs SET updated_at = now() WHERE run_id = $1", second)
        cancel = asyncio.create_task(
            store.cancel_session("default", "s", CANCELED_ERROR, "test", grace_ms=0)
        )

        await eventually(lambda: _waiting_for_a_lock(other, "%cancel_requested%"), timeout=10)
        # Now the other transaction wants the first run: a deadlock, which Postgres breaks
        # by rolling the store's statement back; the store runs it again.
        taken = asyncio.create_task(
            other.execute("UPDATE runs SET updated_at = now() WHERE run_id = $1", first)
        )
        await asyncio.wait_for(taken, 15)
        await tx.commit()
        canceled = await asyncio.wait_for(cancel, 15)
    finally:
        await other.close()
        await store.close()
    assert sorted(uuid.UUID(r.run_id) for r in canceled) == sorted(runs)
    assert {r.status for r in canceled} == {RunStatus.CANCELED}
    assert any("met a deadlock" in r.getMessage() for r in caplog.records)


async def test_two_relays_writing_overlapping_segments_at_once_store_each_frame_once(
    db_url: str,
) -> None:
    """A relay that lost its partition may flush frames 3 to 8 at the moment the new owner
    writes 1 to 5: one of them is left out, so no frame is counted, or replayed, twice."""
    store = await Store.connect(db_url, pool_size=2)
    other = await asyncpg.connect(db_url)
    try:
        run_id = (await _insert(store, "overlap")).run_id

        def segment(first: int, last: int) -> Segment:
            frames = [json.dumps({"seq": s}) for s in range(first, last + 1)]
            return Segment(run_id, first, last, last, frames, closed=False)

        new_owner = segment(1, 5)
        tx = other.transaction()
        await tx.start()
        await other.fetch(
            QUERIES["insert_segments"],
            [uuid.UUID(run_id)],
            [new_owner.first_seq],
            [new_owner.last_seq],
            [new_owner.last_stream_seq],
            ["[" + ",".join(new_owner.frames) + "]"],
            [False],
        )
        stale = asyncio.create_task(store.insert_segments([segment(3, 8)]))

        await eventually(lambda: _waiting_for_a_lock(other), timeout=10)
        await tx.commit()
        await asyncio.wait_for(stale, 15)
        ranges = await store.segment_ranges(run_id)
        run = await store.get_run_by_id(run_id)
    finally:
        await other.close()
        await store.close()
    assert [(first, last) for first, last, _ in ranges] == [(1, 5)]
    assert run is not None
    assert (run.frame_count, run.last_seq) == (5, 5)


def _count_statements(store: Store) -> list[str]:
    """The names of the store's queries from now on, in the order they run."""
    statements: list[str] = []
    fetch = store._fetch

    async def counted(name: str, *args: object) -> list[asyncpg.Record]:
        statements.append(name)
        return await fetch(name, *args)

    store._fetch = counted  # type: ignore[method-assign]
    return statements


async def test_attempts_that_renew_their_leases_together_do_it_in_one_statement(
    db_url: str,
) -> None:
    """The renewals (and the cancel polls) that an executor's attempts make at the same
    moment go to Postgres as one statement: each still learns whether its run is to be
    canceled, and one that was fenced out still loses its lease."""
    store = await Store.connect(db_url, pool_size=2)
    try:
        runs = [await _insert(store, f"hb-{i}") for i in range(3)]
        claimed = []
        for run in runs:
            got = await store.claim(run.run_id, run.generation, "test-executor", 60_000)
            assert got is not None
            claimed.append(got)
        fenced, canceled, _ = claimed
        conn = await asyncpg.connect(db_url)
        try:
            # A newer attempt of the first run (as recovery makes one), a cancel of the second.
            await conn.execute(
                "UPDATE runs SET generation = generation + 1 WHERE run_id = $1",
                uuid.UUID(fenced.run_id),
            )
            await conn.execute(
                "UPDATE runs SET cancel_requested = true WHERE run_id = $1",
                uuid.UUID(canceled.run_id),
            )
        finally:
            await conn.close()
        statements = _count_statements(store)
        renewals = await asyncio.gather(
            *(store.heartbeat(r.run_id, r.generation, 60_000, "x") for r in claimed),
            return_exceptions=True,
        )
        polls = await asyncio.gather(
            *(store.cancel_requested(r.run_id, r.generation) for r in claimed),
            return_exceptions=True,
        )
    finally:
        await store.close()
    assert statements == ["heartbeat_many", "cancel_requested_many"]
    for outcomes in (renewals, polls):
        assert isinstance(outcomes[0], LostRace)
        assert outcomes[1:] == [True, False]


async def test_claims_made_together_are_one_statement_and_start_each_attempt_once(
    db_url: str,
) -> None:
    """The claims of the jobs an executor fetched together go as one statement, each as
    if alone: a job delivered twice starts one attempt, and the second run of a session
    waits for the first."""
    store = await Store.connect(db_url, pool_size=2)
    try:
        alone = await _insert(store, "c-alone")
        first = await _insert(store, "c-first", session_id="s", multitask="enqueue")
        second = await _insert(store, "c-second", session_id="s", multitask="enqueue")
        conn = await asyncpg.connect(db_url)
        try:
            # Its job as if it had one (a repeat, or a bug): the session still decides.
            await conn.execute(
                "UPDATE runs SET job_published_at = now() WHERE run_id = $1",
                uuid.UUID(second.run_id),
            )
        finally:
            await conn.close()
        statements = _count_statements(store)
        jobs = [alone, alone, second, first]
        claimed = await asyncio.gather(
            *(store.claim(r.run_id, r.generation, "test-executor", 60_000) for r in jobs)
        )
    finally:
        await store.close()
    assert statements == ["claim_runs"]
    started = [(c.run_id, c.status, c.attempts) if c else None for c in claimed]
    assert started == [
        (alone.run_id, RunStatus.RUNNING, 1),
        None,  # the same job again
        None,  # its session's earlier run starts first
        (first.run_id, RunStatus.RUNNING, 1),
    ]


async def test_finishes_made_together_are_one_statement_and_one_bad_result_spoils_none(
    db_url: str,
) -> None:
    """The finishes an executor's attempts record at the same moment go as one statement;
    a result Postgres refuses (a NUL character) fails its own run's write only, and an
    attempt that was fenced out still loses the race."""
    store = await Store.connect(db_url, pool_size=2)
    try:
        runs = [await _insert(store, f"f-{i}") for i in range(4)]
        claimed = [await store.claim(r.run_id, r.generation, "test-executor", 60_000) for r in runs]
        good, other, fenced, bad = [c for c in claimed if c is not None]
        conn = await asyncpg.connect(db_url)
        try:
            await conn.execute(
                "UPDATE runs SET generation = generation + 1 WHERE run_id = $1",
                uuid.UUID(fenced.run_id),
            )
        finally:
            await conn.close()

        async def finish(run: Run, text: str) -> Run:
            return await store.finish(run.run_id, run.generation, {"text": text}, text, "t", 2)

        statements = _count_statements(store)
        together = await asyncio.gather(
            finish(good, "ok"), finish(other, "fine"), return_exceptions=True
        )
        spoiled = await asyncio.gather(
            finish(fenced, "late"), finish(bad, "nul \x00"), return_exceptions=True
        )
        after = {r.run_id: await store.get_run_by_id(r.run_id) for r in (fenced, bad)}
    finally:
        await store.close()
    assert statements[:1] == ["finish_runs_told"]
    assert [r.status for r in together if isinstance(r, Run)] == [RunStatus.FINISHED] * 2
    assert [r.result for r in together if isinstance(r, Run)] == [{"text": "ok"}, {"text": "fine"}]
    # Each came back with its `done` frame: published without reading the outbox again.
    for run in together:
        assert isinstance(run, Run)
        assert run.messages is not None
        assert [(m.kind, json.loads(m.body)["type"]) for m in run.messages] == [
            (OutboxKind.FRAME, "done")
        ]
    # The second batch failed whole, then each was written alone.
    assert statements[1:4] == ["finish_runs_told", "finish_run", "finish_run"]
    assert isinstance(spoiled[0], LostRace)
    assert isinstance(spoiled[1], StoreError)
    assert all(r is not None and r.status == RunStatus.RUNNING for r in after.values())


def _submitted(request_id: str, **fields: object) -> dict[str, object]:
    """insert_run's arguments for a queued scripted run of the default tenant."""
    return {
        "run_id": str(uuid.uuid4()),
        "tenant": "default",
        "request_id": request_id,
        "session_id": None,
        "multitask": "interrupt",
        "runner": "scripted",
        "input": {"tokens": ["x"]},
        "metadata": {},
        "max_attempts": 3,
        "attempt_timeout_ms": 1000,
        "queue_timeout_ms": None,
        "actor": "test",
        **fields,
    }


async def test_submits_at_the_same_moment_are_one_statement_with_each_run_as_if_alone(
    db_url: str,
) -> None:
    store = await Store.connect(db_url, pool_size=4)
    try:
        alike = _submitted("twice")
        asked = [_submitted(f"r{i}", metadata={"i": i}, queue_timeout_ms=60_000) for i in range(20)]
        asked += [
            alike,
            {**_submitted("twice"), "input": {"tokens": ["y"]}},
            _submitted(
                "full",
                input={"tokens": ["a", "b"], "note": "é\u2028"},
                trace_parent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                config_pin="pin-1",
                budget_tokens=500,
                budget_cost=7,
                effects=["email.send"],
            ),
        ]
        runs = await asyncio.gather(*(store.insert_run(**a) for a in asked))  # type: ignore[arg-type]

        # One commit for all of them (the same transaction wrote every row).
        ids = [uuid.UUID(r.run_id) for r in runs if r is not None]
        xmins = await store._pool.fetch(
            "SELECT DISTINCT xmin::text FROM runs WHERE run_id = ANY($1)", ids
        )
        assert len(xmins) == 1
        # A request_id used twice at once is one run, and the second gets none.
        assert runs[20] is not None
        assert runs[21] is None
        assert runs[20].request_id == "twice"
        assert runs[20].input == {"tokens": ["x"]}
        # Every field as a submit of its own writes it.
        for run, a in zip(runs[:20], asked[:20], strict=True):
            assert run is not None
            assert (run.run_id, run.metadata, run.queue_timeout_ms) == (
                a["run_id"],
                a["metadata"],
                60_000,
            )
            assert run.status == RunStatus.QUEUED
            assert run.job_published_at is not None
        full = runs[22]
        assert full is not None
        row = await store._pool.fetchrow(
            "SELECT input, trace_parent, config_pin, budget_tokens, budget_cost, effects,"
            " workflow, auth_fence IS NOT NULL AS fenced FROM runs WHERE run_id = $1",
            uuid.UUID(full.run_id),
        )
        assert dict(row) == {
            "input": {"tokens": ["a", "b"], "note": "é\u2028"},
            "trace_parent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "config_pin": "pin-1",
            "budget_tokens": 500,
            "budget_cost": 7,
            "effects": ["email.send"],
            "workflow": None,
            "fenced": True,
        }
        # Each has its `submitted` event and its job in the outbox.
        events = await store._pool.fetchval(
            "SELECT count(*) FROM run_events WHERE event = 'submitted' AND run_id = ANY($1)", ids
        )
        jobs = await store._pool.fetchval(
            "SELECT count(*) FROM outbox WHERE kind = 'job' AND run_id = ANY($1)", ids
        )
        assert events == jobs == 22
    finally:
        await store.close()


async def test_a_submit_comes_back_with_its_job_so_that_nothing_reads_the_outbox_again(
    db_url: str,
) -> None:
    """A submit's statement returns the job its insert wrote: the submitter publishes it
    right after the commit. Each run gets its own job (the rows the outbox holds for the
    transaction, as the dispatch would have read them); a lone submit as well; a large
    input, inserted on its own, leaves its job to be read from the outbox."""
    store = await Store.connect(db_url, pool_size=4)
    try:
        asked = [_submitted(f"j{i}") for i in range(6)]
        runs = [r for r in await asyncio.gather(*(store.insert_run(**a) for a in asked)) if r]  # type: ignore[arg-type]
        lone = await store.insert_run(**_submitted("alone"))  # type: ignore[arg-type]
        large = await store.insert_run(**_submitted("large", input={"text": "x" * 20_000}))  # type: ignore[arg-type]
        assert lone is not None
        assert large is not None
        for run in [*runs, lone]:
            assert run.messages is not None
            assert [(m.kind, m.run_id, m.runner) for m in run.messages] == [
                (OutboxKind.JOB, run.run_id, "scripted")
            ]
            assert json.loads(run.messages[0].body)["generation"] == 0
            assert run.xact is not None
            stored = (await store.outbox_of([run.xact]))[run.xact]
            assert run.messages[0] in stored
        assert large.messages is None
        assert [m.kind for m in (await store.outbox_of([large.xact or ""]))[large.xact or ""]] == [
            OutboxKind.JOB
        ]
    finally:
        await store.close()


async def test_a_quota_refuses_only_the_runs_of_a_batch_past_it(db_url: str) -> None:
    store = await Store.connect(db_url, pool_size=4)
    try:
        await store.set_tenant_budget("default", {"max_active_runs": 3})
        outcomes = await asyncio.gather(
            *(store.insert_run(**_submitted(f"q{i}")) for i in range(7)),  # type: ignore[arg-type]
            return_exceptions=True,
        )
        accepted = [o for o in outcomes if isinstance(o, Run)]
        refused = [o for o in outcomes if isinstance(o, QuotaExceeded)]
        assert (len(accepted), len(refused)) == (3, 4), outcomes
        assert "quota is 3" in refused[0].message
    finally:
        await store.close()


async def test_published_rows_and_a_finishing_run_never_wait_for_each_other_in_a_circle(
    db_url: str,
) -> None:
    """The outbox deletes what it published while runs finish, and a finishing run
    deletes its job row (run_messages, one run after the other in run id order). Two
    runs whose job rows were written in the opposite order of their ids used to deadlock
    the two: Postgres broke the circle only after a second (deadlock_timeout)."""
    store = await Store.connect(db_url, pool_size=2)
    finishing = await asyncpg.connect(db_url)
    publishing = await asyncpg.connect(db_url)
    try:
        runs = [await store.insert_run(**_submitted(f"circle-{i}")) for i in range(8)]  # type: ignore[arg-type]
        rows = await store._pool.fetch(
            "SELECT id, run_id FROM outbox WHERE kind = 'job' AND run_id = ANY($1) ORDER BY id",
            [uuid.UUID(run.run_id) for run in runs],
        )
        # Two job rows whose runs sort the other way round.
        first, second = next(
            (a, b) for i, a in enumerate(rows) for b in rows[i + 1 :] if a["run_id"] > b["run_id"]
        )
        await finishing.execute("BEGIN")
        # The finishing batch reaches the lower run id first: its job row is taken.
        await finishing.execute(
            "DELETE FROM outbox WHERE run_id = $1 AND kind = 'job'", second["run_id"]
        )
        published = asyncio.create_task(
            publishing.execute(QUERIES["outbox_delete"], [first["id"], second["id"]])
        )

        async def waiting() -> bool:
            return bool(
                await store._pool.fetchval(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND pid = $1",
                    publishing.get_server_pid(),
                )
            )

        await eventually(waiting)
        # ... then the higher one's, which the outbox must not be holding meanwhile.
        await asyncio.wait_for(
            finishing.execute(
                "DELETE FROM outbox WHERE run_id = $1 AND kind = 'job'", first["run_id"]
            ),
            timeout=0.5,
        )
        await finishing.execute("COMMIT")
        await asyncio.wait_for(published, timeout=5)
        left = await store._pool.fetchval(
            "SELECT count(*) FROM outbox WHERE id = ANY($1)", [first["id"], second["id"]]
        )
        assert left == 0
    finally:
        await finishing.close()
        await publishing.close()
        await store.close()
