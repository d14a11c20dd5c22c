"""Peak resident memory of each service process, sampled by a background thread.

A phase (`begin("throughput")` ... `end()`) records each process's peak RSS while it
lasted, so a scenario can report the memory it needed.
"""

from __future__ import annotations

import threading

import psutil

SAMPLE_INTERVAL_S = 0.05
MIB = 1024 * 1024


class RssSampler:
    """Samples the RSS of named processes; keeps the peak of each during a phase."""

    def __init__(self) -> None:
        self._procs: dict[str, psutil.Process] = {}
        self._peaks: dict[str, int] = {}
        self._phase: str | None = None
        self.phases: dict[str, dict[str, float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, name: str, pid: int) -> None:
        with self._lock:
            try:
                self._procs[name] = psutil.Process(pid)
            except psutil.NoSuchProcess:
                self._procs.pop(name, None)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)

    def begin(self, phase: str) -> None:
        with self._lock:
            self._phase = phase
            self._peaks = {}
        self._sample()

    def end(self) -> dict[str, float]:
        """Close the phase; return each process's peak RSS in MiB."""
        self._sample()
        with self._lock:
            peaks = {name: rss / MIB for name, rss in sorted(self._peaks.items())}
            if self._phase is not None:
                self.phases[self._phase] = peaks
            self._phase = None
        return peaks

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            self._sample()

    def _sample(self) -> None:
        with self._lock:
            if self._phase is None:
                return
            for name, proc in list(self._procs.items()):
                try:
                    rss = proc.memory_info().rss
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                if rss > self._peaks.get(name, 0):
                    self._peaks[name] = rss
