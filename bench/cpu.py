"""CPU time of named processes over a window, read from /proc (through psutil).

A process group such as Postgres counts its postmaster, every live child and the
children that already exited (their time is in the postmaster's `children_*`), so a
backend that ends inside the window is not lost; a group of loose pids (the backends
one service's connections are served by) counts only those.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil


def _own(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def _tree(proc: psutil.Process) -> float:
    """The process, its live descendants, and the children it has reaped."""
    times = proc.cpu_times()
    total = times.user + times.system + times.children_user + times.children_system
    for child in proc.children(recursive=True):
        try:
            total += _own(child)
        except psutil.NoSuchProcess:
            continue
    return float(total)


@dataclass
class CpuClock:
    """What to measure: `single` processes by name, `trees` (a process and its
    descendants) by name, and `groups` of pids counted together by name."""

    single: dict[str, int] = field(default_factory=dict)
    trees: dict[str, int] = field(default_factory=dict)
    groups: dict[str, list[int]] = field(default_factory=dict)

    def read(self) -> dict[str, float]:
        """CPU seconds used so far, by name (a process that is gone counts 0)."""
        found: dict[str, float] = {}
        for name, pid in self.single.items():
            found[name] = _safely(_own, pid)
        for name, pid in self.trees.items():
            found[name] = _safely(_tree, pid)
        for name, pids in self.groups.items():
            found[name] = sum(_safely(_own, pid) for pid in pids)
        return found

    def measure_start(self) -> tuple[float, dict[str, float]]:
        return time.monotonic(), self.read()

    def ms_per_second(self, start: tuple[float, dict[str, float]]) -> dict[str, float]:
        """CPU milliseconds per second of wall time since `start`, by name."""
        began, before = start
        after = self.read()
        wall = max(1e-9, time.monotonic() - began)
        return {
            name: round((after[name] - before.get(name, 0.0)) * 1000 / wall, 2) for name in after
        }


def _safely(read: Callable[[psutil.Process], float], pid: int) -> float:
    try:
        return read(psutil.Process(pid))
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0.0


def private_mib(pid: int) -> float | None:
    """Private memory (USS) of a process and its descendants, in MiB: what they hold of
    their own, shared memory (Postgres's shared buffers) not counted in each of them."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
        total = 0
        for proc in procs:
            try:
                total += proc.memory_full_info().uss
            except psutil.NoSuchProcess:
                continue
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    return round(total / 2**20, 1)
