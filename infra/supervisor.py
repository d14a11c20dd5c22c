"""One supervisord instance of the local stack: its configuration file and its control socket.

`runwire.infra.stack` decides what runs (the two servers and the four services); this module
writes that down as a supervisord configuration, starts supervisord, and asks it about
its programs, over XML-RPC on the unix socket for the frequent polls and through
`supervisorctl` for `shutdown` and `status`.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import xmlrpc.client
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

# supervisord's own log, beside its programs' (`<program>.log`).
SUPERVISORD_LOG = "supervisord.log"


def venv_tool(name: str) -> Path:
    """A command installed next to the interpreter running us (the project venv).

    The path is deliberately not resolved so it keeps pointing into the venv, rather than
    whatever is on PATH or the interpreter the venv was made from.
    """
    return Path(sys.executable).parent / name


@dataclass(frozen=True)
class Program:
    """A process for supervisord to start, watch and restart."""

    name: str
    argv: list[str]
    directory: Path
    # Extra `[program:x]` settings (priority, stopsignal, user, environment, ...).
    options: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Supervisor:
    """A supervisord known by its configuration file and its control socket."""

    conf: Path
    socket: Path

    def write_config(
        self, *, logs: Path, pid_file: Path, directory: Path, programs: Sequence[Program]
    ) -> None:
        """(Re)write the configuration: the control socket, supervisord, every program."""
        header = f"""\
; Written by `python -m runwire.infra.stack up`; regenerated on every start.
[unix_http_server]
file={self.socket}
chmod=0700

[supervisorctl]
serverurl=unix://{self.socket}

[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface

[supervisord]
logfile={logs / SUPERVISORD_LOG}
logfile_maxbytes=10MB
logfile_backups=2
pidfile={pid_file}
childlogdir={logs}
directory={directory}
"""
        if os.geteuid() == 0:
            # Says we mean to run as root, which silences supervisord's warning about it.
            header += "user=root\n"
        sections = [header, *(_section(program, logs) for program in programs)]
        self.conf.write_text("\n".join(sections))
        os.chmod(self.conf, 0o600)  # the services' identities are in their environment

    def start(self) -> subprocess.CompletedProcess[str]:
        """Start supervisord, which daemonizes once its programs are launched."""
        return subprocess.run(
            [str(venv_tool("supervisord")), "-c", str(self.conf)],
            capture_output=True,
            text=True,
            check=False,
        )

    def ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run `supervisorctl` against this supervisord (`shutdown`, `status`, ...)."""
        return subprocess.run(
            [str(venv_tool("supervisorctl")), "-c", str(self.conf), *args],
            capture_output=True,
            text=True,
            check=False,
        )

    def process_info(self) -> list[dict[str, Any]]:
        """Ask supervisord (over its socket) about every program; [] if it does not answer.

        Talking XML-RPC directly costs a socket round trip, where `supervisorctl` would
        cost a Python start-up on every poll.
        """
        from supervisor.xmlrpc import SupervisorTransport

        transport = SupervisorTransport(None, None, f"unix://{self.socket}")
        proxy = xmlrpc.client.ServerProxy("http://127.0.0.1", transport=transport)
        try:
            info = proxy.supervisor.getAllProcessInfo()
        except (OSError, xmlrpc.client.Error):
            return []
        finally:
            transport.close()
        return cast(list[dict[str, Any]], info)

    def states(self) -> dict[str, str]:
        """Map program name to supervisord state (RUNNING, STARTING, BACKOFF, FATAL, ...)."""
        return {str(info["name"]): str(info["statename"]) for info in self.process_info()}

    def program_pids(self) -> dict[str, int]:
        """Map program name to the pid of its running process."""
        return {
            str(info["name"]): int(info["pid"])
            for info in self.process_info()
            if int(info["pid"]) > 0
        }


def environment(values: dict[str, str]) -> str:
    """A program's `environment=` value: KEY="value" pairs."""
    pairs = (f'{key}="{value}"' for key, value in values.items())
    return ",".join(pairs).replace("%", "%%")


def _quote(argv: Iterable[str]) -> str:
    # supervisord expands %(name)s in its config, so a literal % must be doubled.
    return " ".join(shlex.quote(arg) for arg in argv).replace("%", "%%")


def _section(program: Program, logs: Path) -> str:
    lines = [
        f"[program:{program.name}]",
        f"command={_quote(program.argv)}",
        f"directory={program.directory}",
        "autostart=true",
        "autorestart=true",
        "startsecs=1",
        f"stdout_logfile={logs / f'{program.name}.log'}",
        "stdout_logfile_maxbytes=10MB",
        "stdout_logfile_backups=2",
        "redirect_stderr=true",
        # A SIGKILL after stopwaitsecs must also reach the program's children.
        "killasgroup=true",
    ]
    lines += [f"{key}={value}" for key, value in program.options.items()]
    return "\n".join(lines) + "\n"
