"""The streaming peer's producer (scenario 10): the Redis Streams relay that LangGraph
Platform and Vercel's `resumable-stream` build resumable token streams on.

`python -m bench.redis_producer SPEC` (SPEC: JSON) pops jobs from a list, and for each
one streams `tokens` tokens on the run's stream, one `XADD` per token every
`delay_ms` (each stamped with the time it was added), then a `done` entry: the part
that runwire's executor and relay play. It runs until it is killed.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import redis.asyncio as redis

from bench.stream_readers import token

# Jobs popped at once: as many producers as the readers start runs at once.
POPPERS = 16


async def main(spec: dict[str, Any]) -> None:
    pool = redis.BlockingConnectionPool.from_url(
        spec["redis_url"], max_connections=spec["max_runs"] + POPPERS + 8, timeout=60
    )
    db = redis.Redis(connection_pool=pool)
    tokens, delay = spec["tokens"], spec["delay_ms"] / 1000
    jobs = f"{spec['namespace']}:jobs"
    running: set[asyncio.Task[None]] = set()

    async def stream(run: int) -> None:
        key = f"{spec['namespace']}:s:{run}"
        loop = asyncio.get_running_loop()
        due = loop.time()
        for i in range(tokens):
            await db.xadd(key, {"t": token(run, i), "at": repr(time.time())})
            due += delay  # a steady pace, as runwire's scripted runner keeps
            await asyncio.sleep(max(0.0, due - loop.time()))
        await db.xadd(key, {"done": "1"})

    async def pop() -> None:
        while True:
            popped = await db.blpop([jobs], timeout=1)
            if popped is None:
                continue
            task = asyncio.create_task(stream(json.loads(popped[1])["run"]))
            running.add(task)
            task.add_done_callback(running.discard)

    print("ready", flush=True)
    await asyncio.gather(*(pop() for _ in range(POPPERS)))


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
