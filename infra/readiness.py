"""Waiting for the local stack to serve, and saying why it does not.

`runwire.infra.stack up` starts every program under supervisord, then waits here: for
every service replica to answer its health request (`runwire.infra.health`), then for
each gateway's `/healthz`. It gives up at the start timeout, when supervisord stops
restarting a program (FATAL), or as soon as a program exits with EXIT_CONFIG: a service
that refuses its configuration (a runner that cannot be loaded, a setting out of range)
would refuse it again at every restart, so `up` says why at once, with the lines of its
log that say so, and exits with that status.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats.errors

from runwire.client.settings import EXIT_CONFIG
from runwire.infra.health import Health, HealthProbe
from runwire.infra.processes import unchecked_tls
from runwire.infra.supervisor import SUPERVISORD_LOG, Supervisor
from runwire.infra.topology import Topology

PROGRESS_EVERY = 2.0
PROGRESS_REPEAT = 10.0
POLL_S = 0.2
EXIT_NOT_UP = 1
# Programs that load one configuration refuse it together: how long to wait for the
# others once one has, so that all are named.
REFUSAL_GRACE_S = 2.0
# supervisord's log line of a process that ended: `exited: NAME (exit status N; ...)`, or
# `(terminated by SIGKILL; ...)`. Its process info keeps no exit status of a process that
# exited before it counted as started (`startsecs`): its log is where that is said.
_EXIT_LINE = re.compile(r" exited: (\S+) \((?:exit status (\d+))?")
# Lines of a program's log that may say why it refused its configuration.
_REASON_LINES = 30


def say(message: str) -> None:
    print(message, flush=True)


class Progress:
    """Says now and then what a wait is still waiting for."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.start = time.monotonic()
        self._last_report = self.start
        self._last_said = ""

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def tick(self, describe: Callable[[], str] | str) -> None:
        """Say `describe` (or what it returns: it is called only when due) if it is time."""
        now = time.monotonic()
        if now - self._last_report < PROGRESS_EVERY:
            return
        said = describe if isinstance(describe, str) else describe()
        # Say it when something changed, else only every so often, to stay readable.
        if said != self._last_said or now - self._last_report >= PROGRESS_REPEAT:
            say(f"  ... waiting for {self.what} ({self.elapsed:.0f} s): {said}")
            self._last_report, self._last_said = now, said


def wait(what: str, done: Callable[[], bool], describe: Callable[[], str], timeout: float) -> bool:
    """Poll `done` until true or `timeout`, printing `describe()` now and then."""
    progress = Progress(what)
    while not done():
        if progress.elapsed > timeout:
            return False
        progress.tick(describe)
        time.sleep(POLL_S)
    return True


@dataclass(frozen=True)
class NotUp:
    """Why the stack is not up: what went wrong and, per program, what was seen of it;
    `code` is what `up` exits with."""

    what: str
    problems: dict[str, str]
    timed_out: bool
    code: int = EXIT_NOT_UP

    @property
    def refused(self) -> bool:
        """Whether a program refused its configuration (starting again will not help)."""
        return self.code == EXIT_CONFIG


def refused(logs: Path, programs: Iterable[str]) -> NotUp | None:
    """The programs of `programs` (those that do not serve) whose process last exited
    with EXIT_CONFIG: their configuration is refused, and it is the same at every
    restart. With the reasons their logs give; None if none did."""
    exits = last_exits(logs / SUPERVISORD_LOG)
    found = {
        name: _reason(logs / f"{name}.log") for name in programs if exits.get(name) == EXIT_CONFIG
    }
    if not found:
        return None
    names = ", ".join(sorted(found))
    what = f"{names} refused {'its' if len(found) == 1 else 'their'} configuration"
    return NotUp(f"{what} (exit status {EXIT_CONFIG})", found, False, EXIT_CONFIG)


def last_exits(log: Path) -> dict[str, int | None]:
    """Each program's last exit as supervisord's log says it: its exit status, or None
    when a signal ended it."""
    found: dict[str, int | None] = {}
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return found
    for match in _EXIT_LINE.finditer(text):
        found[match[1]] = None if match[2] is None else int(match[2])
    return found


def _reason(log: Path) -> str:
    """What a program that refused its configuration said of it: the error lines its log
    ends with (a JSON line's message, or a setting's `runwire: NAME: ...` line)."""
    try:
        lines = log.read_text(errors="replace").splitlines()[-_REASON_LINES:]
    except OSError:
        return "it wrote no log"
    reasons: list[str] = []
    for line in lines:
        text = line.strip()
        record: Any = None
        if text.startswith("{"):
            try:
                record = json.loads(text)
            except ValueError:
                record = None
        if isinstance(record, dict):
            if record.get("level") not in ("error", "critical"):
                continue
            text = str(record.get("msg", text))
        elif not (text.startswith("runwire: ") or " cannot start: " in text):
            continue
        if text not in reasons:  # each restart says it again
            reasons.append(text)
    return "; ".join(reasons) or "its log does not say why"


async def unanswered(
    supervisor: Supervisor,
    logs: Path,
    shape: Topology,
    prefix: str,
    identity: tuple[str | None, str | None],
    timeout: float,
) -> NotUp | None:
    """Ask every service for its health (as `identity`) until each of its replicas has
    answered (None), giving up at `timeout`, when supervisord stops restarting one of
    them, or at once when one refuses its configuration."""
    progress = Progress("the services to answer")
    services = shape.services
    seen = dict.fromkeys(services, "no answer")
    probe: HealthProbe | None = None
    try:
        while True:
            pending = [service for service in services if seen[service] != "answers"]
            if probe is None:
                # The NATS client retries a server that is down for minutes: look first.
                if not any(await asyncio.to_thread(lambda: [n.ready() for n in shape.nats])):
                    gone = f"NATS at {shape.nats_url} does not answer"
                    seen.update(dict.fromkeys(pending, gone))
                else:
                    try:
                        probe = await HealthProbe.connect(
                            shape.nats_url, prefix, *identity, tls_ca=shape.nats_ca
                        )
                    except (TimeoutError, OSError, nats.errors.Error) as exc:
                        seen.update(dict.fromkeys(pending, f"NATS refuses clients ({exc!r})"))
            if probe is not None:
                answers = await asyncio.gather(*(probe.ask_replicas(name) for name in pending))
                for service, healths in zip(pending, answers, strict=True):
                    seen[service] = replicas_state(healths, shape.count(service))
                    if seen[service] == "answers":
                        say(f"  {_counted(service, shape)} answers ({progress.elapsed:.1f} s)")
            pending = [service for service in services if seen[service] != "answers"]
            if not pending:
                return None
            waiting = [r.program for r in shape.replicas if r.service in pending]
            if await asyncio.to_thread(refused, logs, waiting) is not None:
                await asyncio.sleep(REFUSAL_GRACE_S)
                return await asyncio.to_thread(refused, logs, waiting)
            states = await asyncio.to_thread(supervisor.states)
            report = {
                name: f"{states.get(name, 'unknown')}, {seen[service]}"
                for name, service in ((r.program, r.service) for r in shape.replicas)
                if service in pending
            }
            fatal = [name for name in report if states.get(name) == "FATAL"]
            if fatal:
                return NotUp(f"supervisord stopped restarting {', '.join(fatal)}", report, False)
            if progress.elapsed > timeout:
                what = f"{', '.join(pending)} did not answer a health request within {timeout:g} s"
                return NotUp(what, report, True)
            progress.tick("; ".join(f"{name} {state}" for name, state in report.items()))
            await asyncio.sleep(POLL_S)
    finally:
        if probe is not None:
            await probe.close()


def replicas_state(healths: list[Health], wanted: int) -> str:
    """ "answers" once `wanted` replicas answer healthy; else what is seen of them."""
    healthy = sum(health.ok for health in healths)
    if healthy >= wanted:
        return "answers"
    if not healths:
        return "no answer"
    if wanted == 1:
        return healths[0].state
    others = sorted({health.state for health in healths if not health.ok})
    return f"{healthy} of {wanted} replicas answer" + (f" ({'; '.join(others)})" if others else "")


def _counted(service: str, shape: Topology) -> str:
    count = shape.count(service)
    return service if count == 1 else f"{service} ({count} replicas)"


def gateway_unanswered(
    supervisor: Supervisor, logs: Path, name: str, url: str, timeout: float
) -> NotUp | None:
    """Ask gateway program `name`'s /healthz until it answers (None), as `unanswered`
    does."""
    progress = Progress("the gateway to answer")
    while True:
        try:
            # Over HTTPS when the shell gave the gateway a certificate.
            with urllib.request.urlopen(
                f"{url}/healthz", timeout=2, context=unchecked_tls()
            ) as response:
                if response.status == 200:
                    say(f"  {name} answers at {url} ({progress.elapsed:.1f} s)")
                    return None
                seen = f"HTTP {response.status}"
        except (OSError, ValueError) as exc:
            seen = f"no answer ({exc.__class__.__name__})"
        not_up = refused(logs, [name])
        if not_up is not None:
            return not_up
        state = supervisor.states().get(name, "unknown")
        report = {name: f"{state}, {seen}"}
        if state == "FATAL":
            return NotUp(f"supervisord stopped restarting {name}", report, False)
        if progress.elapsed > timeout:
            return NotUp(f"{name} did not answer at {url} within {timeout:g} s", report, True)
        progress.tick(f"{name} {state}, {seen}")
        time.sleep(POLL_S)


def tail(path: Path, lines: int = 15) -> str:
    """The last `lines` of a log, indented."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "    (no log yet)"
    return "\n".join(f"    {line}" for line in text.splitlines()[-lines:])
