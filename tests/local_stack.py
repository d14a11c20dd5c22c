"""The local stack of `make up`, started by a test in a folder of its own.

`python -m runwire.infra.stack --root <folder>/.runwire up` is what `make up` runs (supervisord,
nats-server, Postgres and the four services, on free ports), with its files in the
test's folder instead of the repository's `.runwire/`, so tests can each run one in
parallel, next to a developer's own stack. The environment is the test process's minus
every `RUNWIRE_*` and `OTEL_*` variable, plus what the test passes, as if typed in a
clean shell.

A machine that is busy or has cold caches starts the services slowly; `slow_start_s`
makes every service process that slow on any machine, so a test of readiness does not
pass only because this one is fast.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from runwire.client import Client
from runwire.infra.auth import read_env_file
from runwire.infra.processes import find_free_port

ROOT = Path(__file__).resolve().parent.parent
# Longer than `up` itself may wait (for the servers, then for the services).
COMMAND_TIMEOUT_S = 150.0
SERVICE_MODULES = ("runwire.submitter", "runwire.executor", "runwire.relay", "runwire.recovery")
# Python imports `sitecustomize` from the path at start-up, before the service's code.
SLOW_START = """\
# Written by tests/local_stack.py: a runwire service starts {delay} s late.
import time

argv = open("/proc/self/cmdline", "rb").read().split(b"\\0")
if any(arg.decode() in {modules!r} for arg in argv):
    time.sleep({delay})
"""


@dataclass(frozen=True)
class LocalStack:
    """A stack that `up` started (or failed to start) in `folder`."""

    folder: Path
    shell: dict[str, str]
    returncode: int
    output: str

    @property
    def root(self) -> Path:
        return self.folder / ".runwire"

    def env(self, name: str = "env") -> dict[str, str]:
        """What `up` wrote to `.runwire/env` (or another of its settings files)."""
        return read_env_file(self.root / name)


async def client_of(env: dict[str, str]) -> Client:
    """A client as the identity of settings `env` (a stack's `.runwire/env`, say)."""
    return await Client.connect(
        env["RUNWIRE_NATS_URL"],
        prefix=env["RUNWIRE_PREFIX"],
        tenant=env.get("RUNWIRE_TENANT", "default"),
        user=env.get("RUNWIRE_NATS_USER"),
        password=env.get("RUNWIRE_NATS_PASSWORD"),
        tls_ca=Path(env["RUNWIRE_NATS_TLS_CA"]),  # `up` makes the stack speak TLS only
    )


async def cli(stack: LocalStack, *args: str) -> tuple[int, str, str]:
    """`runwire ARGS` as typed in the folder `make up` ran in: exit status, stdout, stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "runwire.client.cli",
        *args,
        cwd=stack.folder,
        env={**stack.shell, "PYTHONPATH": str(ROOT)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def clean_shell(**settings: str) -> dict[str, str]:
    """This process's environment without runwire's and OpenTelemetry's variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNWIRE_", "OTEL_"))}
    return {**env, **settings}


async def stack_command(
    folder: Path, command: str, shell: dict[str, str], *options: str
) -> tuple[int, str]:
    """`python -m runwire.infra.stack <command>` for the stack in `folder`: exit status, output."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "runwire.infra.stack",
        "--root",
        str(folder / ".runwire"),
        *options,
        command,
        cwd=ROOT,
        env=shell,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), COMMAND_TIMEOUT_S)
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")


@asynccontextmanager
async def local_stack(
    folder: Path,
    *,
    start_timeout: float = 60,
    slow_start_s: float = 0,
    slow_modules: tuple[str, ...] = SERVICE_MODULES,
    cluster: int = 0,
    **settings: str,
) -> AsyncIterator[LocalStack]:
    """`up` (`--cluster N` when given) with these settings (`RUNWIRE_*`, or any variable
    of the shell); `down` at the end, whatever `up` did. `slow_start_s` delays the
    services of `slow_modules` (all by default)."""
    # A gateway port of its own: stacks of parallel tests must not find each other's.
    shell = clean_shell(RUNWIRE_GATEWAY_PORT=str(find_free_port()), **settings)
    if slow_start_s:
        hook = folder / "slow-start"
        hook.mkdir()
        text = SLOW_START.format(delay=slow_start_s, modules=slow_modules)
        (hook / "sitecustomize.py").write_text(text)
        shell["PYTHONPATH"] = str(hook)
    options = ["--start-timeout", str(start_timeout)]
    if cluster:
        options += ["--cluster", str(cluster)]
    code, output = await stack_command(folder, "up", shell, *options)
    try:
        yield LocalStack(folder, shell, code, output)
    finally:
        code, output = await stack_command(folder, "down", shell)
        assert code == 0, output
