"""Server processes started from the pip wheels: each in its own process group, stopped
at interpreter exit, and on Linux also dying with the thread that started it, so that a
crashed test run does not leave servers behind; and the loopback ports they listen on.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

POLL_INTERVAL = 0.02
PR_SET_PDEATHSIG = 1


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path`, readable by this user only (it may hold a secret)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


def unchecked_tls() -> ssl.SSLContext:
    """A TLS context that checks no certificate: only to ask our own servers on loopback
    whether they answer (who they are is for their clients to check), never to talk."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def find_free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def port_is_free(port: int) -> bool:
    """Tell whether a server could listen on `port` on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Servers set SO_REUSEADDR, so connections of a stopped server in TIME_WAIT do not
        # keep them from listening again; only a live listener does.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class Process:
    """One server subprocess in its own process group, stopped at interpreter exit."""

    def __init__(self, name: str, stop_signal: signal.Signals) -> None:
        self.name = name
        self.stop_signal = stop_signal
        self.popen: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return None if self.popen is None else self.popen.pid

    def spawn(self, argv: list[str], log_path: Path, user: str | None, cwd: Path) -> None:
        with log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                user=user,
                # A session of its own keeps Ctrl-C in the terminal from reaching the server
                # before the owner has shut down cleanly, and gives stop() a group to kill.
                start_new_session=True,
                preexec_fn=die_with_parent(self.stop_signal),
            )
        atexit.register(self.stop)

    def exited(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def signal(self, sig: signal.Signals) -> None:
        if self.popen is None:
            raise ProcessLookupError(f"{self.name} is not running")
        self.popen.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL the whole group at once and forget the process."""
        popen = self.popen
        if popen is None:
            return
        self.popen = None
        atexit.unregister(self.stop)
        kill_group(popen.pid)
        popen.wait()

    def stop(self, timeout: float = 15.0) -> None:
        popen = self.popen
        if popen is None:
            return
        self.popen = None
        atexit.unregister(self.stop)
        if popen.poll() is None:
            try:
                popen.send_signal(self.stop_signal)
                popen.wait(timeout)
            except subprocess.TimeoutExpired:
                kill_group(popen.pid)
                popen.wait()
        # Postgres backends share the group; make sure none outlives the postmaster.
        kill_group(popen.pid)


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        # The whole group is already gone (or the id now belongs to someone else).
        return


def die_with_parent(sig: signal.Signals) -> Callable[[], None] | None:
    """Build a pre-exec hook asking Linux to signal the child when its parent dies.

    atexit does not run when the parent is killed with SIGKILL (a timed-out CI job, an
    OOM kill), and an orphaned server would hold its port and folder. The kernel ties
    this signal to the *thread* that forked, so it is only armed from the main thread,
    whose end is the end of the process.
    """
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def hook() -> None:
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        # The parent may already be gone before prctl took effect.
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return hook


def wait_until(ready: Callable[[], bool], process: Process, timeout: float, log_path: Path) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        code = process.exited()
        if code is not None:
            raise RuntimeError(
                f"{process.name} exited with status {code} while starting:\n{tail(log_path)}"
            )
        if time.monotonic() > deadline:
            process.stop()
            raise TimeoutError(f"{process.name} not ready after {timeout:.0f} s:\n{tail(log_path)}")
        time.sleep(POLL_INTERVAL)


def tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])
