"""The pgqueuer peer's worker process: one no-op entrypoint with the bench's
concurrency limit.

Run as `python -m bench.pgqueuer_worker DATABASE_URL CONCURRENCY READY_FILE`; it
installs pgqueuer's schema, writes READY_FILE and works until SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from datetime import timedelta
from pathlib import Path

import asyncpg
from pgqueuer import Job, Queries, QueueManager

ENTRYPOINT = "noop"
BATCH_SIZE = 10


def _mark_ready(path: str) -> None:
    Path(path).write_text("ready\n")


async def serve(url: str, concurrency: int, ready: str) -> None:
    conn = await asyncpg.connect(url)
    queries = Queries.from_asyncpg_connection(conn)
    if not await queries.schema_is_installed():
        await queries.install()
    manager = QueueManager(queries)

    @manager.entrypoint(ENTRYPOINT, concurrency_limit=concurrency)
    async def noop(job: Job) -> None:
        return None

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, manager.shutdown.set)
    _mark_ready(ready)
    # Log aggregation off: it would fold the per-job log rows the bench reads.
    await manager.run(batch_size=BATCH_SIZE, log_aggregation_interval=timedelta(0))


def main() -> None:
    asyncio.run(serve(sys.argv[1], int(sys.argv[2]), sys.argv[3]))


if __name__ == "__main__":
    main()
