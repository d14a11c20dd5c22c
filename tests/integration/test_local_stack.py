"""`make up` returns when the stack serves: a script can use it on the next line."""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path

import pytest

from runwire.client import Client, ClientError
from runwire.contracts.errors import ErrorCode
from runwire.contracts.health import HealthReply
from runwire.contracts.status import RunStatus
from runwire.contracts.subjects import Subjects
from tests.local_stack import ROOT, local_stack
from tests.services import collect

pytestmark = pytest.mark.integration

SERVICES = ("submitter", "executor", "relay", "recovery")
SLOW_START_S = 3


async def test_a_run_submitted_right_after_up_finishes(tmp_path: Path) -> None:
    # Services that take seconds to start, as on a busy machine: supervisord reports them
    # RUNNING after one second, long before they serve anything.
    async with local_stack(tmp_path, slow_start_s=SLOW_START_S) as stack:
        assert stack.returncode == 0, stack.output
        env = stack.env()
        # Straight away, once each, no retry: what a script does after `make up`.
        client = await Client.connect(env["RUNWIRE_NATS_URL"], prefix=env["RUNWIRE_PREFIX"])
        subjects = Subjects(env["RUNWIRE_PREFIX"])
        try:
            reply = await client.submit({"tokens": ["right", " after", " up"]})
            health = [
                HealthReply.model_validate_json(
                    (await client.nc.request(subjects.health(name), b"{}", timeout=2)).data
                )
                for name in SERVICES
            ]
            with pytest.raises(ClientError) as missing:
                await client.join(str(uuid.uuid4()))
            _, transcript = await collect(client, reply.run.run_id)
            final = await client.get(reply.run.run_id)
        finally:
            await client.close()

        assert reply.duplicate is False
        assert [(h.service, h.ok) for h in health] == [(name, True) for name in SERVICES]
        assert missing.value.code == ErrorCode.NOT_FOUND  # the relay answers joins too
        assert transcript.text == "right after up"
        assert final.status == RunStatus.FINISHED

        # And as a user types it, from the folder `make up` ran in.
        cli = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "runwire.client.cli",
            "submit",
            "--tokens",
            "hi",
            "--watch",
            cwd=tmp_path,
            env={**stack.shell, "PYTHONPATH": str(ROOT)},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(cli.communicate(), 60)
        assert cli.returncode == 0, err.decode()
        queued, text, ended = out.decode().splitlines()
        run_id = queued.split()[1]
        assert (queued, text, ended) == (f"run {run_id} queued", "hi", f"run {run_id} finished")

        # The README's SDK example, verbatim, from the same folder: no URL, no port.
        example = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _readme_block("## Python SDK"),
            cwd=tmp_path,
            env=stack.shell,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(example.communicate(), 60)
        assert example.returncode == 0, err.decode()
        assert out.decode().strip() == "'Hello world' finished"


def _readme_block(section: str) -> str:
    """The first Python block of a README section."""
    text = (ROOT / "README.md").read_text()
    body = text[text.index(f"\n{section}\n") :]
    start = body.index("```python\n") + len("```python\n")
    return body[start : body.index("```", start)]


async def test_up_names_the_service_that_never_answers_and_its_log(tmp_path: Path) -> None:
    # The executor refuses this setting at start, so supervisord keeps restarting it.
    async with local_stack(tmp_path, start_timeout=20, RUNWIRE_HEARTBEAT_MS="100000") as stack:
        assert stack.returncode == 1, stack.output
        log = stack.root / "logs" / "executor.log"
        lines = stack.output.splitlines()
        headline = next(line for line in lines if line.startswith("The stack did not come up"))
        assert headline == (
            "The stack did not come up: executor did not answer a health request within 20 s."
        )
        detail = next(line for line in lines if line.startswith("  executor: "))
        assert detail.endswith(f"no answer; last lines of {log}:")
        assert "heartbeat_ms must be at most half" in stack.output  # the log's tail
        answered = {line.split()[0] for line in lines if " answers (" in line}
        assert answered == {"submitter", "relay", "recovery"}
        assert "make up START_TIMEOUT=120" in stack.output
