"""Which processes belong to a local stack: supervisord, the programs it runs (recorded
in `pids.json`) and the servers (their own pid files), each checked in /proc so that a
recycled pid is never taken for ours; `down` stops them even when supervisord itself died.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path

from runwire.infra.layout import Layout


def pid_alive(pid: int) -> bool:
    """Tell whether process `pid` runs (a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is dead for our purposes: it holds no port and no file.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def is_ours(pid: int, layout: Layout) -> bool:
    """Tell whether `pid` is a process this stack started (never trust a recycled pid)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return False
    if str(layout.root) in argv:
        return True
    try:
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return False
    return cwd == layout.repo or layout.repo in cwd.parents


def supervisord_pid(layout: Layout) -> int | None:
    """The pid of the stack's supervisord, or None when it does not run."""
    try:
        pid = int(layout.supervisord_pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    if pid_alive(pid) and is_ours(pid, layout):
        return pid
    return None


def record_pids(layout: Layout) -> None:
    """Remember our pids so `down` can clean up even if supervisord itself died."""
    pids = layout.supervisor.program_pids()
    supervisord = supervisord_pid(layout)
    if supervisord is not None:
        pids["supervisord"] = supervisord
    layout.pids_file.write_text(json.dumps(pids))


def known_pids(layout: Layout) -> set[int]:
    """The stack's processes that are alive: those recorded, and the servers'."""
    pids: set[int] = set()
    try:
        recorded = json.loads(layout.pids_file.read_text())
        pids.update(int(pid) for pid in recorded.values())
    except (OSError, ValueError, AttributeError, TypeError):
        pass  # nothing recorded: only what is alive now counts
    # The servers' own pid files are missing or stale when they are not running.
    postmaster = layout.pg_dir / "postmaster.pid"
    with contextlib.suppress(OSError, ValueError, IndexError):
        pids.add(int(postmaster.read_text().split()[0]))
    for pid_file in (layout.nats_pid_file, *layout.nats_dir.glob("n*/nats-server.pid")):
        with contextlib.suppress(OSError, ValueError):
            pids.add(int(pid_file.read_text().strip()))
    return {pid for pid in pids if pid_alive(pid) and is_ours(pid, layout)}


def describe(pid: int) -> str:
    """`pid` with its program and first arguments, for a progress line."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return str(pid)
    words = [Path(argv[0].decode()).name] + [arg.decode() for arg in argv[1:3] if arg]
    return f"{pid} ({' '.join(words)})"


def send_signal(pid: int, sig: signal.Signals) -> None:
    """Send `sig` to `pid` unless it is gone."""
    # It may have exited on its own meanwhile.
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
