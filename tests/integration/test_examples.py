"""Every example of the README and docs/ runs as written (tests/doc_examples.py: how each
is marked): each page's runnable blocks, in order, in one shell of the page's own,
against one local stack that `up` started as `make up` does, in a folder laid out as the
repository (its virtualenv, Makefile and examples/). The README's tour comes first, from
a shell without runwire on its PATH; the pages after it run with the virtualenv on the
PATH, as the tour leaves a reader's shell. And the runner's test of docs/runners.md
passes with runwire's test kit."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from runwire.testing.servers import Servers
from tests import doc_examples
from tests.doc_examples import ROOT, Block
from tests.local_stack import local_stack

pytestmark = pytest.mark.integration

# What the README's tour finds in the repository's folder.
REPOSITORY = (".venv", "Makefile", "pyproject.toml", "examples")
PAGE_TIMEOUT_S = 120
# A make that runs the tests hands its own jobs to the make of a block otherwise.
MAKE_VARIABLES = ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")


@dataclass(frozen=True)
class Ran:
    """What a page's runnable blocks printed, each block's output apart."""

    blocks: list[Block]
    outputs: list[str]

    def output(self, part: str) -> str:
        """The output of the one block that holds `part` (or runs the file `part`)."""
        [found] = [
            out
            for block, out in zip(self.blocks, self.outputs, strict=True)
            if part in block.text or block.what == part
        ]
        return found


def _repository(tmp_path: Path) -> Path:
    """A folder where `make up`, `.venv/bin` and `examples/` work as in the repository,
    with a `.runwire/` of its own."""
    folder = tmp_path / "runwire"
    folder.mkdir()
    for name in REPOSITORY:
        (folder / name).symlink_to(ROOT / name)
    return folder


def _path_without_runwire(path: str) -> str:
    venvs = {str(ROOT / ".venv" / "bin"), str(Path(sys.executable).parent)}
    return os.pathsep.join(entry for entry in path.split(os.pathsep) if entry not in venvs)


async def _run(page: Path, folder: Path, shell: dict[str, str]) -> Ran:
    script, blocks = doc_examples.script(page)
    proc = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        script,
        cwd=folder,
        env=shell,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), PAGE_TIMEOUT_S)
    outputs = out.decode().split(f"{doc_examples.SEPARATOR}\n")[1:]
    last = blocks[len(outputs) - 1] if outputs else None
    assert proc.returncode == 0, (
        f"{last.where if last else page} failed ({proc.returncode}):\n"
        f"{outputs[-1] if outputs else ''}{err.decode()}"
    )
    return Ran(blocks, outputs)


def _json_documents(text: str) -> list[Any]:
    """The JSON documents printed one after another (`runwire budget` and the like)."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while text[at:].strip():
        at += len(text[at:]) - len(text[at:].lstrip())
        value, at = decoder.raw_decode(text, at)
        found.append(value)
    return found


def _trees(text: str) -> list[list[str]]:
    """The node trees `runwire get --nodes` printed, each as its lines' words."""
    trees = [tree for tree in re.split(r"^(?=run )", text, flags=re.MULTILINE) if tree.strip()]
    return [[" ".join(line.split()) for line in tree.splitlines()] for tree in trees]


def _readme(ran: Ran) -> None:
    queued, text, ended = ran.output('--tokens "Hello"').splitlines()
    run_id = queued.split()[1]
    assert (queued, text, ended) == (
        f"run {run_id} queued",
        "Hello world",
        f"run {run_id} finished",
    )

    watched = ran.output("RUN_ID=$(runwire submit --tokens a b c d")
    frames = [json.loads(line) for line in watched.splitlines() if line.startswith('{"v"')]
    [summary] = _json_documents(watched[watched.index("\n{\n") :])
    assert [frame["seq"] for frame in frames] == list(range(3, 3 + len(frames)))
    assert [frame["type"] for frame in frames] == ["message", "message", "message", "done"]
    assert "".join(frame["data"].get("text", "") for frame in frames) == "bcd"
    assert (summary["status"], summary["result"]["text"]) == ("finished", "abcd")

    assert ran.output("python examples/stream_a_run.py") == "'Hello world' finished\n"

    *_, queued, text, ended = ran.output("--runner echo").splitlines()
    run_id = queued.split()[1]
    assert (queued, text, ended) == (f"run {run_id} queued", "hihihi", f"run {run_id} finished")


def _architecture(ran: Ran) -> None:
    assert ran.output("examples/sessions.py").splitlines() == [
        "long answer: canceled SUPERSEDED",
        "new answer: finished",
        "first, second, third, one after the other: True",
    ]
    assert ran.output("examples/follow_events.py").splitlines() == [
        "submitted queued",
        "claimed running",
        "finished finished",
    ]


def _cli(ran: Ran) -> None:
    said = ran.output(".runwire/operator.env budget")
    added = said.index("tenant acme: ")
    read, limited, policy, acmes = _json_documents(said[:added] + said[said.index("{", added) :])
    assert (read["tenant"], limited["tenant"], limited["max_active_runs"]) == (
        "default",
        "default",
        100,
    )
    assert policy == acmes
    assert (policy["tenant"], policy["effects"]) == ("acme", ["http", "noop"])


def _effects_and_budgets(ran: Ran) -> None:
    written, read = _json_documents(ran.output("budget --tokens 100000 --cost 5000"))
    for budget in (written, read):
        assert (budget["tenant"], budget["tokens"], budget["cost"]) == ("default", 100000, 5000)


def _flow_control(ran: Ran) -> None:
    (budget,) = _json_documents(ran.output("budget --share 2 --max-queued-runs 5000"))
    assert (budget["tenant"], budget["share"], budget["max_queued_runs"]) == ("default", 2, 5000)
    assert budget["max_runs_per_key"] == 3
    (scheduled,) = _json_documents(ran.output("runwire schedule add nightly"))
    (nightly,) = scheduled["schedules"]
    assert (nightly["name"], nightly["tz"], nightly["overlap"]) == (
        "nightly",
        "Europe/Oslo",
        "skip",
    )
    assert nightly["next_fire_at"] is not None
    later = ran.output('runwire submit --tokens "later" --delay-ms 3600000')
    assert re.fullmatch(r"run [0-9a-f-]{36} queued\n", later), later
    assert budget["share_runs"] == 2 * 64  # the stack's default share, weighed
    (limits,) = _json_documents(ran.output("limit set openai:gpt-4o"))
    assert limits["limits"] == [
        {"key": "openai:gpt-4o", "rpm": 500, "tpm": 30000, "requests": 0, "tokens": 0, "waiting": 0}
    ]


def _webhooks(ran: Ran) -> None:
    (hooks,) = _json_documents(ran.output("runwire webhooks --url"))
    assert hooks["endpoints"] == [
        {"url": "https://hooks.example.com/runwire", "events": ["ended", "waiting"]}
    ]
    assert hooks["secret"].startswith("whsec_")


def _gateway(ran: Ran) -> None:
    events = [
        json.loads(line.removeprefix("data: "))
        for line in ran.output("curl -sN").splitlines()
        if line.startswith("data: ")
    ]
    assert [event["type"] for event in events] == ["run", "message", "message", "done"]
    assert "".join(event["data"].get("text", "") for event in events) == "Hi there"
    assert ran.output("examples/langgraph_stream.py") == "Hi there\n"


def _python_sdk(ran: Ran) -> None:
    assert ran.output("examples/stream_a_run.py") == "'Hello world' finished\n"


def _workflows(ran: Ran) -> None:
    changes = ran.output("examples/run_a_workflow.py").splitlines()
    assert changes[:2] == ["greet started", "greet fell_back"]
    assert changes[-3:] == ["sign started", "sign completed", "finished 'Hi, Ada (from runwire)'"]

    released, *printed = ran.output("runwire release greeting 1").splitlines()
    assert released.startswith("release greeting v1: already published, unchanged (3 nodes")
    trees = _trees("\n".join(printed))
    assert all(before != after for before, after in itertools.pairwise(trees[:-1]))
    run_id = trees[-1][0].split()[1]
    assert trees[-1] == [
        f"run {run_id} finished (release greeting v1)",
        "greet failed attempt 1 RUNNER_FATAL",
        "└─ greet_plainly completed attempt 1 (in place of greet)",
        "sign completed attempt 1",
    ]
    assert trees[-2] == trees[-1]  # the watch's last, then `get --nodes`


# What a reader sees on each page that has examples to run.
CHECKS: dict[str, Callable[[Ran], None]] = {
    "README.md": _readme,
    "architecture.md": _architecture,
    "cli.md": _cli,
    "effects-and-budgets.md": _effects_and_budgets,
    "flow-control.md": _flow_control,
    "gateway.md": _gateway,
    "python-sdk.md": _python_sdk,
    "webhooks.md": _webhooks,
    "workflows.md": _workflows,
}


async def test_every_example_of_the_readme_and_the_docs_runs_as_written(tmp_path: Path) -> None:
    pages = [page for page in doc_examples.PAGES if any(b.runs for b in doc_examples.blocks(page))]
    assert pages[0].name == "README.md"
    assert sorted(page.name for page in pages) == sorted(CHECKS)
    folder = _repository(tmp_path)
    async with local_stack(folder) as stack:
        assert stack.returncode == 0, stack.output
        shell = {k: v for k, v in stack.shell.items() if k not in MAKE_VARIABLES}
        # A reader's shell: runwire is not on its PATH before the README puts it there.
        readme = {**shell, "PATH": _path_without_runwire(shell["PATH"])}
        CHECKS["README.md"](await _run(pages[0], folder, readme))
        # The tour left the virtualenv first on the PATH.
        docs = {**readme, "PATH": f"{folder / '.venv' / 'bin'}{os.pathsep}{readme['PATH']}"}
        for page in pages[1:]:
            CHECKS[page.name](await _run(page, folder, docs))


def test_the_runners_test_of_the_docs_passes_with_runwires_test_kit(
    infra: Servers, tmp_path: Path
) -> None:
    # As `cd examples && python -m pytest my_agents`, on this session's servers.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNWIRE_", "PYTEST_"))}
    env |= {"RUNWIRE_TEST_NATS_URL": infra.nats_url, "RUNWIRE_TEST_DATABASE_URL": infra.admin_url}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--basetemp",
            str(tmp_path / "basetemp"),
            "my_agents",
        ],
        cwd=ROOT / "examples",
        env=env,
        capture_output=True,
        text=True,
        timeout=PAGE_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
