"""A client process of the many-streams scenario (10): it starts its share of the runs
and follows each one to its end, through runwire or through the Redis Streams peer.

`python -m bench.stream_readers SPEC` (SPEC: JSON). Every run streams `tokens` tokens,
one per `delay_ms`. At the wall-clock time `start_at`, the process starts its runs one
after another (a submit each for runwire; for Redis, the job pushed on a list that the
peer's producer pops), each followed as soon as it is started: `Client.stream` for
runwire, a blocking `XREAD` from the last id seen for Redis. It prints one JSON line:
per run, when it was started, its first and last token and whether its text was exact,
and every token's lag (receipt minus the time the producer stamped on it), in ms.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from runwire.client import Client
from runwire.contracts.frames import FrameType, Transcript

# Runs started at once by one process (submits in flight), as a burst of users would.
STARTING = 64


def token(run: int, i: int) -> str:
    return f"{run}.{i} "


def expected_text(run: int, tokens: int) -> str:
    return "".join(token(run, i) for i in range(tokens))


class Tally:
    """What one reader process saw."""

    def __init__(self) -> None:
        self.runs: dict[int, dict[str, Any]] = {}
        self.lags: list[float] = []

    def started(self, run: int) -> dict[str, Any]:
        entry = self.runs[run] = {"started": time.time(), "first": None, "last": None}
        return entry

    def token(self, entry: dict[str, Any], stamped: float, count: int = 1) -> None:
        """`count` tokens received now, the first of them stamped `stamped` (the tokens
        that joined a frame are counted with the lag of the first: never less)."""
        now = time.time()
        if entry["first"] is None:
            entry["first"] = now
        entry["last"] = now
        self.lags.extend([round((now - stamped) * 1000, 2)] * count)


async def _runwire(spec: dict[str, Any], tally: Tally) -> None:
    client = await Client.connect(spec["nats_url"], prefix=spec["prefix"], tenant="default")
    tokens, delay = spec["tokens"], spec["delay_ms"]

    async def one(run: int, gate: asyncio.Semaphore) -> None:
        script = {"tokens": [token(run, i) for i in range(tokens)], "token_delay_ms": delay}
        async with gate:
            entry = tally.started(run)
            reply = await client.submit(script)
        # As a client shows it: a resumed attempt's `run` frame takes back what it redoes.
        transcript = Transcript()
        async for frame in client.stream(reply.run.run_id):
            transcript.apply(frame)
            if frame.type == FrameType.MESSAGE:
                # A frame may carry several tokens (deltas emitted while the run's frame
                # before was on its way join it): each token ends with a space.
                tally.token(entry, frame.at.timestamp(), frame.data["text"].count(" "))
            elif frame.type == FrameType.RUN:
                entry["attempts"] = frame.data.get("attempt")
            elif frame.type == FrameType.DONE:
                entry["status"] = frame.data.get("status")
        entry["exact"] = transcript.text == expected_text(run, tokens)

    try:
        # Warm, as a product's long-lived server is: one run followed to its end before
        # the clock starts (a fresh process's first submit and stream pay one-off costs).
        warm = await client.submit({"tokens": ["warm "]})
        async for _ in client.stream(warm.run.run_id):
            pass
        await _start_all(spec, one)
    finally:
        await client.close()


async def _redis(spec: dict[str, Any], tally: Tally) -> None:
    import redis.asyncio as redis  # the bench's venv only

    tokens = spec["tokens"]
    pool = redis.BlockingConnectionPool.from_url(
        spec["redis_url"], max_connections=len(spec["runs"]) + 8, timeout=60
    )
    db = redis.Redis(connection_pool=pool)

    async def one(run: int, gate: asyncio.Semaphore) -> None:
        key = f"{spec['namespace']}:s:{run}"
        async with gate:
            entry = tally.started(run)
            await db.rpush(f"{spec['namespace']}:jobs", json.dumps({"run": run}))
        text, last_id, done = [], "0-0", False
        while not done:
            # Resume by id: what a re-joining reader of a Redis stream does too.
            got = await db.xread({key: last_id}, block=10_000, count=500)
            if not got:
                raise TimeoutError(f"stream {key} went quiet")
            for _, entries in got:
                for entry_id, fields in entries:
                    last_id = entry_id
                    if b"done" in fields:
                        done = True
                        entry["status"] = "finished"
                        continue
                    tally.token(entry, float(fields[b"at"]))
                    text.append(fields[b"t"].decode())
        entry["exact"] = "".join(text) == expected_text(run, tokens)

    try:
        await db.ping()  # warm: the pool's first connection is made before the clock starts
        await _start_all(spec, one)
    finally:
        await db.aclose()
        await pool.aclose()


async def _start_all(
    spec: dict[str, Any], one: Callable[[int, asyncio.Semaphore], Awaitable[None]]
) -> None:
    """At `start_at`, start every run of the spec (STARTING at a time) and follow each."""
    await asyncio.sleep(max(0.0, spec["start_at"] - time.time()))
    gate = asyncio.Semaphore(STARTING)
    await asyncio.gather(*(one(run, gate) for run in spec["runs"]))


async def main(spec: dict[str, Any]) -> None:
    tally = Tally()
    follow = _runwire if spec["system"] == "runwire" else _redis
    error = None
    try:
        await asyncio.wait_for(follow(spec, tally), spec.get("timeout_s", 120))
    except Exception as exc:  # noqa: BLE001 - reported to the bench, which records it
        error = f"{type(exc).__name__}: {exc}"
    print(json.dumps({"runs": tally.runs, "lags_ms": tally.lags, "error": error}))


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
