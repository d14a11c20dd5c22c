"""A service given a setting it cannot use stops at once with one line that names the
variable (never its value), not a traceback."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("module", "variable", "value", "says"),
    [
        ("runwire.relay", "RUNWIRE_EVENT_LOOP", "trio", "Input should be 'auto' or 'asyncio'"),
        ("runwire.submitter", "RUNWIRE_DB_POOL_SIZE", "s3cret-pool", "a valid integer"),
        ("runwire.gateway", "RUNWIRE_GATEWAY_PORT", "s3cret-port", "a valid integer"),
        (
            "runwire.executor",
            "RUNWIRE_EFFECT_HTTP_ALLOW_NETWORKS",
            "10.0.0.0/8,s3cret/8",
            "not a comma-separated list of CIDRs",
        ),
        (
            "runwire.executor",
            "RUNWIRE_EFFECT_HTTP_ALLOW_HOSTS",
            "https://s3cret.example.com",
            "not a comma-separated list of host names",
        ),
    ],
)
def test_a_service_with_an_unusable_setting_says_which_and_exits_2(
    module: str, variable: str, value: str, says: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", module],
        env={"PATH": "/usr/bin:/bin", variable: value},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"runwire: {variable}: ")
    assert says in lines[0]
    assert "Traceback" not in done.stderr
    assert value not in done.stderr + done.stdout
