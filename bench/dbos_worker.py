"""The DBOS peer's worker process: a queue with the bench's concurrency, and a
workflow of one no-op step.

Run as `python -m bench.dbos_worker DATABASE_URL CONCURRENCY POLL_S READY_FILE`; it
writes READY_FILE once DBOS is launched and the queue registered, then works until
SIGTERM.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

from dbos import DBOS

QUEUE = "bench"
WORKFLOW = "noop_workflow"


@DBOS.step()
def noop_step() -> None:
    return None


@DBOS.workflow()
def noop_workflow() -> None:
    noop_step()


def main() -> None:
    url, concurrency, poll_s, ready = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    DBOS(
        config={
            "name": "runwire-bench",
            "system_database_url": url,
            "sys_db_pool_size": 20,
            "log_level": "WARNING",
            "executor_id": "bench-dbos-worker",
        }
    )
    DBOS.launch()
    DBOS.register_queue(QUEUE, global_concurrency=concurrency, polling_interval_sec=poll_s)
    Path(ready).write_text("ready\n")
    stop.wait()
    DBOS.destroy()


if __name__ == "__main__":
    main()
