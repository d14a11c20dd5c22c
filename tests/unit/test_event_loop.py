"""A service process runs on uvloop, as `faststream run` would start it, unless told
to keep asyncio's loop."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _starting_line(extra_env: dict[str, str]) -> dict[str, object]:
    """The relay's "starting" log line, from a process pointed at nothing (it retries
    Postgres until it is stopped)."""
    env = {
        "PATH": "/usr/bin:/bin",
        "RUNWIRE_LOG_FORMAT": "json",
        "RUNWIRE_NATS_URL": "nats://127.0.0.1:9",
        "RUNWIRE_DATABASE_URL": "postgresql://nobody@127.0.0.1:9/nothing",
        "OTEL_SDK_DISABLED": "true",
        **extra_env,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "runwire.relay"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("{") and '"relay starting"' in line:
                found: dict[str, object] = json.loads(line)
                return found
        raise AssertionError(f"the relay ended (exit {proc.wait()}) without starting")
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(("setting", "loop"), [(None, "uvloop"), ("asyncio", "asyncio")])
def test_a_service_process_runs_on_the_loop_its_settings_choose(
    setting: str | None, loop: str
) -> None:
    env = {"RUNWIRE_EVENT_LOOP": setting} if setting else {}
    assert _starting_line(env)["event_loop"] == loop
