"""What a no-op run, and a streamed token, cost the infrastructure, counted by the
servers themselves: NATS messages on the stack's subjects, Postgres function calls and
row writes. Each bound is the count today: a change that adds work to every run or
every token fails here and says where."""

import asyncio
import collections
import re
from typing import Any

import asyncpg
import nats
import pytest

from runwire.runtime.settings import DEFAULT_SEGMENT_FLUSH_MS
from tests.services import InProcessStack, eventually

pytestmark = pytest.mark.integration

RUNS = 200
NOOP = {"tokens": ["x"]}

# Checks a run without a session, a concurrency key or a webhook endpoint never needs:
# before they were skipped, every run called some of them.
NEVER_CALLED = ("session_blocked", "key_blocked", "webhook_put", "rfc3339")
# Functions called once for a batch of runs (how many per run depends on how busy the
# stack is), and recovery's, called on its timer.
BATCH = ("claim_runs", "finish_runs", "finish_runs_told", "insert_runs", "submit_runs")
BATCH += ("write_segments", "outbox_done", "xact_messages")
PERIODIC = ("time_out_waits", "workflow_sweep")


async def _counters(admin: asyncpg.Connection) -> dict[str, float]:
    """The database's counters now: row writes per table, calls per function."""
    await admin.execute("SELECT pg_stat_clear_snapshot()")
    out: dict[str, float] = {}
    for row in await admin.fetch(
        "SELECT relname, n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_user_tables"
    ):
        for what in ("ins", "upd", "del"):
            out[f"{row['relname']}.{what}"] = row[f"n_tup_{what}"]
    for row in await admin.fetch("SELECT funcname, calls FROM pg_stat_user_functions"):
        out[f"{row['funcname']}()"] = row["calls"]
    return out


async def _settled(admin: asyncpg.Connection, runs: int) -> dict[str, float]:
    """The counters once every backend has reported the runs' writes (a backend reports
    its counters up to seconds after its transactions)."""

    async def reported() -> dict[str, float]:
        counters = await _counters(admin)
        events = await admin.fetchval("SELECT count(*) FROM run_events")
        published = await admin.fetchval(
            "SELECT count(*) FROM run_events WHERE published_at IS NOT NULL"
        )
        assert counters.get("runs.ins") == runs, counters.get("runs.ins")
        assert counters.get("run_events.ins") == events
        assert counters.get("run_events.upd") == published == events
        return counters

    return await eventually(reported, timeout=60, interval=0.5)


async def test_a_no_op_run_costs_a_bounded_count_of_messages_calls_and_writes(
    infra: Any, db_url: str, prefix: str
) -> None:
    name = db_url.rsplit("/", 1)[1]
    admin_db = await asyncpg.connect(infra.database_url(name))
    try:
        # Function calls are counted for sessions that start after this: the services'.
        await admin_db.execute(f"ALTER DATABASE \"{name}\" SET track_functions = 'all'")
        await admin_db.execute("SELECT pg_stat_reset()")
        tap = await nats.connect(infra.nats_url)
        seen: collections.Counter[str] = collections.Counter()
        streams = prefix.upper()

        async def count(msg: Any) -> None:
            subject = msg.subject
            if subject.startswith("$JS.ACK.") and streams in subject:
                seen["$JS.ACK"] += 1
            elif subject.startswith(prefix + "."):
                seen[re.sub(r"\.[0-9a-f]{8}-[0-9a-f-]{27}(\.\d+)?", ".<run>", subject)] += 1

        await tap.subscribe(">", cb=count, pending_msgs_limit=1_000_000)
        await tap.flush()
        # A no-op run needs no heartbeat: on a busy machine one held past a heartbeat
        # would add its lease renewal and progress ack to what is counted here.
        slow_beats = {"heartbeat_ms": 30_000, "lease_ttl_ms": 60_000, "ack_wait_ms": 60_000}
        # The relay writes segments as a deployment does (the test stacks, faster).
        settings = {**slow_beats, "segment_flush_ms": DEFAULT_SEGMENT_FLUSH_MS}
        async with InProcessStack(infra.nats_url, db_url, prefix, overrides=settings) as stack:
            gate = asyncio.Semaphore(64)

            async def submit() -> str:
                async with gate:
                    return (await stack.client.submit(NOOP)).run.run_id

            run_ids = await asyncio.gather(*(submit() for _ in range(RUNS)))
            await eventually(
                lambda: admin_db.fetchval(
                    "SELECT count(*) = $2 FROM runs WHERE run_id = ANY($1::uuid[])"
                    " AND status = 'finished' AND frames_closed",
                    run_ids,
                    RUNS,
                ),
                timeout=120,
                interval=0.2,
            )
            counters = await _settled(admin_db, RUNS)
        await tap.flush()
        await tap.close()
    finally:
        await admin_db.close()

    per_run = {k: v / RUNS for k, v in counters.items() if v}
    messages = sum(seen.values()) / RUNS
    calls = sum(
        v
        for k, v in per_run.items()
        if k.endswith("()") and k[:-2] not in BATCH and k[:-2] not in PERIODIC
    )
    report = f"messages by subject: {dict(seen)}; per run: {per_run}"
    for name in NEVER_CALLED:
        assert per_run.get(f"{name}()", 0) == 0, report
    # The counts today: 13 messages on the stack's subjects (a submit; its job published
    # and delivered; 3 run events; 3 frames published, and republished on the run's live
    # subject, where the relay hears them: 19 when the relay read them through a consumer
    # and acknowledged each; the job's ack); 13 calls of functions that run once per run
    # (42 before the checks above were skipped); the run's row written 3 times after its
    # insert (claimed, finished, its frames written; 4 to 5 before, see below), a few
    # twice (their frames in two segments); 3 run events.
    assert messages <= 13.5, report
    assert calls <= 13.5, report
    assert per_run.get("runs.upd", 0) <= 3.6, report
    assert per_run.get("run_events.ins", 0) <= 3.5, report
    assert per_run.get("outbox.ins", 0) <= 2, report
    # A run's frames are one segment (2.6 when every run's `done` flushed every run's
    # buffered frames), written with one update of its row; two for a run whose `done`
    # came more than segment_flush_ms after its `run` frame (on a loaded machine).
    assert per_run.get("frame_segments.ins", 0) <= 1.6, report
    # A batch of runs ended together starts its tenant's next share turn once (each start
    # counts the tenant's jobs), not once per run.
    turns, batches = per_run.get("start_share_turn()", 0), per_run.get("finish_runs()", 0)
    assert turns <= batches + 0.05, report


TOKENS = 250
STREAMS = 4


async def test_a_token_costs_a_bounded_count_of_messages_and_writes(
    infra: Any, db_url: str, prefix: str
) -> None:
    """Streaming, one frame a token (coalescing off): what each token costs NATS and
    Postgres once the stack is up, its runs' own messages and writes included."""
    name = db_url.rsplit("/", 1)[1]
    admin_db = await asyncpg.connect(infra.database_url(name))
    tap = await nats.connect(infra.nats_url)
    seen: collections.Counter[str] = collections.Counter()

    async def count(msg: Any) -> None:
        subject = msg.subject
        if subject.startswith(prefix + "."):
            seen[re.sub(r"\.[0-9a-f]{8}-[0-9a-f-]{27}(\.\d+)?", ".<run>", subject)] += 1
        elif subject.startswith("_SVC_INBOX_"):
            seen[f"replies to {subject.split('.')[0].removeprefix('_SVC_INBOX_')}"] += 1
        elif subject.startswith(("$JS.ACK.", "$JS.API.")):
            seen[".".join(subject.split(".")[:4])] += 1

    settings = {
        "coalesce_text": False,
        "segment_flush_ms": DEFAULT_SEGMENT_FLUSH_MS,
        "heartbeat_ms": 30_000,
        "lease_ttl_ms": 60_000,
        "ack_wait_ms": 60_000,
    }
    try:
        async with InProcessStack(infra.nats_url, db_url, prefix, overrides=settings) as stack:
            await admin_db.execute("SELECT pg_stat_reset()")
            await tap.subscribe(">", cb=count, pending_msgs_limit=1_000_000)
            await tap.flush()
            script = {"tokens": ["t"] * TOKENS, "token_delay_ms": 2}
            sent = [await stack.client.submit(script) for _ in range(STREAMS)]
            runs = [s.run.run_id for s in sent]
            await eventually(
                lambda: admin_db.fetchval(
                    "SELECT count(*) = $2 FROM runs WHERE run_id = ANY($1::uuid[])"
                    " AND status = 'finished' AND frames_closed",
                    runs,
                    len(runs),
                ),
                timeout=120,
                interval=0.2,
            )
            counters = await _settled(admin_db, len(runs))
            # How long the runs streamed: the relay writes a run's frames every
            # segment_flush_ms while it streams (and once more at its `done`).
            flushes = await admin_db.fetchval(
                "SELECT sum(ceil(extract(epoch FROM ended_at - started_at) * 1000 / $2) + 1)"
                "  FROM runs WHERE run_id = ANY($1::uuid[])",
                runs,
                DEFAULT_SEGMENT_FLUSH_MS,
            )
            await tap.flush()
    finally:
        await tap.close()
        await admin_db.close()
    frames = (TOKENS + 2) * STREAMS  # each run's `run`, its tokens, its `done`
    report = f"messages by subject: {dict(seen)}; writes: {counters}"
    # A frame is three messages: published by its attempt, acknowledged by the stream,
    # republished on the run's live subject (which the relay and the clients hear).
    published = f"{prefix}.frames.out.default.<run>"
    assert seen[published] == seen[f"{prefix}.default.runs.<run>.live"] == frames, report
    assert seen["replies to executor"] <= frames * 1.1, report
    # Postgres: a segment per run and flush interval, not per frame; the run's row written
    # once per segment besides its claim and end.
    assert counters["frame_segments.ins"] <= flushes, report
    assert counters["runs.upd"] <= flushes + 2 * STREAMS, report
    assert counters.get("run_events.ins", 0) <= 3 * STREAMS, report
