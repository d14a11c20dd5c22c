"""kill -9 of recovery (the process that times waits out) while answers race their waits'
timeouts: each of 1,000 waits is decided once, answered or timed out, and the `resume`
reply, what the runner saw, the run's events, its wait in Postgres and its status all
say the same."""

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from runwire.client import ClientError
from runwire.contracts.errors import ErrorCode
from runwire.contracts.replies import RunSummary
from runwire.contracts.status import RunStatus
from runwire.runtime import faults
from runwire.testing.waiting import eventually, pace
from tests.services import ProcessStack, ServiceProcess

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(420)]

RUNNERS = "asks=tests.waiting:asks"
TRIES = 1000
# Runs submitted and not finished at once: the stack's steady load.
WINDOW = 160
# A wait's timeout (s), and when its answer is sent, from its timeout_at (s): about the
# moment recovery (ticking every TICK_MS) times it out, so both win many times; half of
# the answers within a tick of it, where an answer and the timeout meet in Postgres.
TIMEOUTS_S = (0.2, 1.5)
OFFSETS_S = (-0.5, 1.0)
CLOSE_OFFSETS_S = (-0.05, 0.05)
TICK_MS = 50
# How long an incarnation of recovery lives once ready, before its kill -9 (s); one armed
# to kill itself at its first timeout, at most this long.
LIFETIMES_S = (0.1, 1.2)
ARMED_LIFETIME_S = 5.0


@dataclass
class Try:
    """One wait and the answer that races its timeout."""

    index: int
    run_id: str
    handles_timeout: bool
    offset_s: float
    # accepted (the reply said so, or `duplicate` after a reply lost to a kill) or
    # refused NOT_WAITING; None until the answer has a final reply.
    accepted: bool | None = None
    requests: int = 0

    @property
    def answer(self) -> dict[str, str]:
        return {"say": f"r{self.index}"}


class Race:
    """Submits the runs, and answers each wait about when it times out."""

    def __init__(self, stack: ProcessStack, rng: random.Random) -> None:
        self.stack = stack
        self.rng = rng
        self.tries: dict[str, Try] = {}
        self.room = asyncio.Semaphore(WINDOW)
        self.answering: set[asyncio.Task[None]] = set()
        self.finished: set[str] = set()

    async def submit_all(self) -> None:
        for i in range(TRIES):
            await self.room.acquire()
            handles = i % 2 == 0
            run_input = {"timeout": self.rng.uniform(*TIMEOUTS_S), "handle_timeout": handles}
            reply = await _retried(
                lambda run_input=run_input, i=i: self.stack.client.submit(
                    run_input, runner="asks", request_id=f"submit-{i}"
                )
            )
            run_id = reply.run.run_id
            offsets = CLOSE_OFFSETS_S if i // 2 % 2 else OFFSETS_S
            self.tries[run_id] = Try(i, run_id, handles, self.rng.uniform(*offsets))

    async def answer_all(self) -> None:
        """Find each wait as it begins (in Postgres), and answer it at its timeout_at
        plus the try's offset; give back its room once its run ended."""
        seen: set[str] = set()
        pool = self.stack.store._pool
        while len(self.finished) < TRIES:
            waits = await pool.fetch(
                "SELECT run_id::text, extract(epoch FROM timeout_at - now()) AS left_s"
                " FROM run_waits"
            )
            for wait in waits:
                try_ = self.tries.get(wait["run_id"])
                if try_ is not None and try_.run_id not in seen:
                    seen.add(try_.run_id)
                    task = asyncio.create_task(self._answer(try_, float(wait["left_s"])))
                    self.answering.add(task)
                    task.add_done_callback(self.answering.discard)
            ended = await pool.fetch(
                "SELECT run_id::text FROM runs WHERE status IN ('finished', 'failed')"
            )
            for row in ended:
                if row["run_id"] in self.tries and row["run_id"] not in self.finished:
                    self.finished.add(row["run_id"])
                    self.room.release()
            await pace(0.03, "how often the test looks for new waits and ended runs")

    async def _answer(self, try_: Try, left_s: float) -> None:
        await pace(max(0.0, left_s + try_.offset_s), "the answer is due about at the timeout")
        client = self.stack.client
        while True:
            try_.requests += 1
            try:
                await client.resume(
                    try_.run_id,
                    try_.answer,
                    wait_id="interrupt-1",
                    request_id=f"answer-{try_.index}",
                )
            except ClientError as exc:
                if exc.code == ErrorCode.NOT_WAITING:
                    try_.accepted = False
                    return
                if not exc.retryable:
                    raise
                # The submitter was killed: the same answer again (the same request_id),
                # which says `duplicate` when the first one was taken.
                await pace(0.1, "between two tries of an answer the submitter did not reply to")
                continue
            try_.accepted = True
            return


async def _retried(send: Any) -> Any:
    while True:
        try:
            return await send()
        except ClientError as exc:
            if not exc.retryable:
                raise
            await pace(0.1, "between two tries of a command the submitter did not reply to")


@dataclass
class Kills:
    recovery: int = 0
    at_fault_point: int = 0
    submitter: int = 0


async def _ready(stack: ProcessStack, name: str, incarnation: int) -> None:
    """The `incarnation`th process of `name` (counting from 1) said it is ready."""
    service = name.split("-")[0]
    await eventually(
        lambda: stack.procs[name].logs().count(f"{service} ready") >= incarnation, timeout=90
    )


async def _kill_recovery_until(
    stack: ProcessStack, done: asyncio.Event, rng: random.Random, kills: Kills
) -> None:
    """Kill recovery at random moments, and start it again at once; every other
    incarnation is armed to kill itself right after their first commit of a
    timeout, before they publish the next attempts' jobs (killed by the test after
    ARMED_LIFETIME_S if no wait came due meanwhile)."""
    incarnation, armed = 1, False
    while not done.is_set():
        await _ready(stack, "recovery", incarnation)
        proc = stack.procs["recovery"]
        if armed:
            with contextlib.suppress(AssertionError):
                await eventually(lambda p=proc: _dead(p), timeout=ARMED_LIFETIME_S)
        else:
            await pace(rng.uniform(*LIFETIMES_S), "recovery lives this long, then it is killed")
        if not _dead(proc):
            proc.kill()
        # Killed by the test too after its fault point: between its commit and its kill.
        if f"fault point {faults.WAIT_TIMED_OUT}" in proc.logs().rsplit("recovery ready", 1)[1]:
            kills.at_fault_point += 1
        kills.recovery += 1
        armed = incarnation % 2 == 1 and not done.is_set()
        stack.start(
            "recovery",
            recovery_interval_ms=TICK_MS,
            fault_points=f"{faults.WAIT_TIMED_OUT}=kill" if armed else "",
        )
        incarnation += 1
    await _ready(stack, "recovery", incarnation)


def _dead(proc: ServiceProcess) -> bool:
    return proc.proc is not None and proc.proc.poll() is not None


async def _none_waiting_past_due(stack: ProcessStack) -> bool:
    """No run waits for a wait whose timeout is behind it by more than a few ticks."""
    late = await stack.store._pool.fetch(
        "SELECT run_id::text, now() - timeout_at AS late FROM runs JOIN run_waits USING (run_id)"
        " WHERE status = 'waiting' AND outcome IS NULL AND timeout_at < now() - $1::interval",
        timedelta(milliseconds=TICK_MS * 10),
    )
    assert not late, [dict(r) for r in late]
    return True


async def _all_ended(stack: ProcessStack, race: Race) -> bool:
    if len(race.finished) < TRIES:
        left = await stack.store._pool.fetch(
            "SELECT status, count(*) FROM runs WHERE status NOT IN ('finished', 'failed')"
            " GROUP BY status"
        )
        raise AssertionError(f"runs not ended: {[tuple(r) for r in left]}")
    return True


def _check(try_: Try, run: RunSummary, wait: Any, events: list[Any]) -> str:
    """Every party says the same about one wait; returns how it was decided."""
    where = (try_, run.status, run.result, run.error, dict(wait), [dict(e) for e in events])
    assert try_.accepted is not None, where
    resumed = [e for e in events if e["event"] == "resumed"]
    claimed = [e for e in events if e["event"] == "claimed"]
    # An attempt taken over from an executor that stopped renewing its lease (a busy
    # machine) is one more, and the only other reason for one.
    taken_over = [e for e in events if e["event"] == "recovering"]
    # Decided once, and one next attempt ran.
    assert len(resumed) == 1, where
    assert len(claimed) == 2 + len(taken_over), where
    assert run.attempts == len(claimed), where
    # The wait in Postgres.
    assert wait["outcome"] == ("answered" if try_.accepted else "timed_out"), where
    if try_.accepted:
        assert wait["request_id"] == f"answer-{try_.index}", where
        assert wait["value"] == try_.answer, where
        # Taken only before the wait's timeout: after it, an answer is refused whether
        # or not recovery was there to time the wait out yet.
        assert wait["decided_at"] < wait["timeout_at"], where
    else:
        assert wait["decided_at"] >= wait["timeout_at"], where
    # The run's event: who woke it (an answer, recovery's timeout), or the attempt
    # itself as it ended, when the wait was decided while it was ending.
    reason = resumed[0]["reason"]
    assert reason in ("answered", "wait timed out", "interrupt-1"), where
    if reason != "interrupt-1":
        assert (reason == "answered") == try_.accepted, where
    # What the runner saw, and how the run ended.
    if try_.accepted:
        assert run.status == RunStatus.FINISHED, where
        assert run.result is not None, where
        assert run.result["answer"] == try_.answer, where
        assert run.result["text"] == f"hello you said r{try_.index}", where
    elif try_.handles_timeout:
        assert run.status == RunStatus.FINISHED, where
        assert run.result == {"answer": None, "text": "hello no answer"}, where
    else:
        assert run.status == RunStatus.FAILED, where
        assert run.error is not None, where
        assert run.error.code == ErrorCode.WAIT_TIMEOUT, where
    return "while ending" if reason == "interrupt-1" else reason


async def test_an_answer_racing_the_timeout_is_decided_once_while_recovery_dies(
    service_env: dict[str, str], tmp_path: Path
) -> None:
    rng = random.Random(20261205)
    stack = ProcessStack({**service_env, "RUNWIRE_RUNNERS": RUNNERS}, tmp_path)
    for name in ("submitter", "relay", "executor"):
        stack.start(name)
    stack.start("recovery", recovery_interval_ms=TICK_MS)
    await stack.open()
    try:
        started = time.monotonic()
        race = Race(stack, rng)
        kills = Kills()
        done = asyncio.Event()
        killing = asyncio.create_task(_kill_recovery_until(stack, done, rng, kills))
        submitting = asyncio.create_task(race.submit_all())
        answering = asyncio.create_task(race.answer_all())
        # Once, mid-way: the submitter too (answers in flight are sent again).
        await eventually(lambda: len(race.finished) >= TRIES * 2 // 5, timeout=240)
        stack.procs["submitter"].kill()
        kills.submitter += 1
        stack.start("submitter")
        await eventually(lambda: len(race.finished) >= TRIES * 9 // 10, timeout=240)
        done.set()
        await killing  # recovery is back for good
        await submitting
        await eventually(lambda: _none_waiting_past_due(stack), timeout=10)
        await eventually(lambda: _all_ended(stack, race), timeout=60)
        await answering
        await asyncio.gather(*race.answering)
        elapsed = time.monotonic() - started

        pool = stack.store._pool
        waits = {
            w["run_id"]: w
            for w in await pool.fetch(
                "SELECT run_id::text, outcome, value, request_id, timeout_at, decided_at"
                " FROM run_waits"
            )
        }
        events: dict[str, list[Any]] = {}
        for e in await pool.fetch(
            "SELECT run_id::text, at, event, status, attempt, actor, code, reason"
            " FROM run_events ORDER BY id"
        ):
            events.setdefault(e["run_id"], []).append(e)
        assert len(waits) == TRIES
        decided: dict[str, int] = {}
        for run_id, try_ in race.tries.items():
            run = await stack.client.get(run_id)
            how = _check(try_, run, waits[run_id], events[run_id])
            decided[how] = decided.get(how, 0) + 1
    finally:
        await stack.close()

    answered = sum(1 for t in race.tries.values() if t.accepted)
    resent = sum(1 for t in race.tries.values() if t.requests > 1)
    taken_over = sum(1 for e in events.values() if any(x["event"] == "recovering" for x in e))
    print(
        f"\nwait race: {TRIES} waits in {elapsed:.0f}s: {answered} answered, "
        f"{TRIES - answered} timed out; woken by {decided}; recovery killed {kills.recovery} "
        f"times ({kills.at_fault_point} at {faults.WAIT_TIMED_OUT}), submitter "
        f"{kills.submitter}; {resent} answers sent again; {taken_over} runs taken over"
    )
    # Both won many times, and the kills happened, at the fault point too.
    assert min(answered, TRIES - answered) >= TRIES // 10
    assert kills.recovery >= 5
    assert kills.at_fault_point >= 1
