"""The `runwire` command against running services, as a user types it."""

import asyncio
import itertools
import json
import os
import re
import socket
import sys
from pathlib import Path

import pytest
from nats.aio.msg import Msg

from runwire.contracts.health import HealthReply
from runwire.contracts.identities import OPERATOR, tenant_user
from runwire.contracts.status import RunStatus
from runwire.contracts.subjects import Subjects
from runwire.infra.auth import write_env_file
from tests.secured import Broker
from tests.services import InProcessStack

pytestmark = pytest.mark.integration


async def _runwire(*args: str, cwd: Path, env: dict[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "runwire.client.cli",
        *args,
        cwd=cwd,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNWIRE_")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    return env


@pytest.fixture
def stack_dir(tmp_path: Path, stack: InProcessStack) -> Path:
    """A folder with the `.runwire/env` that `make up` would write, for this stack."""
    (tmp_path / ".runwire").mkdir()
    (tmp_path / ".runwire" / "env").write_text(
        f"RUNWIRE_NATS_URL={stack.nats_url}\nRUNWIRE_PREFIX={stack.prefix}\n"
    )
    return tmp_path


async def test_submit_and_watch_prints_the_full_text(
    stack: InProcessStack, stack_dir: Path
) -> None:
    code, out, err = await _runwire(
        "submit", "--tokens", "Hello", " world", "--watch", cwd=stack_dir, env=_clean_env()
    )

    assert code == 0, err
    first, text, last = out.strip().split("\n")
    run_id = first.split()[1]
    assert first == f"run {run_id} queued"
    assert text == "Hello world"
    assert last == f"run {run_id} finished"
    assert (await stack.client.get(run_id)).status == RunStatus.FINISHED


async def test_watch_from_a_cursor_get_and_cancel(stack: InProcessStack, stack_dir: Path) -> None:
    env = _clean_env()
    reply = await stack.client.submit({"tokens": ["one", " two", " three"]})
    run_id = reply.run.run_id

    code, out, _ = await _runwire("watch", run_id, "--after", "2", cwd=stack_dir, env=env)
    assert code == 0
    # Frame 1 is the attempt's start and frame 2 the first token: the rest follows.
    assert out.startswith(" two three\n")

    code, out, _ = await _runwire("get", run_id, cwd=stack_dir, env=env)
    assert code == 0
    assert f'"run_id": "{run_id}"' in out
    assert '"status": "finished"' in out

    code, out, _ = await _runwire("cancel", run_id, cwd=stack_dir, env=env)
    assert (code, out.strip()) == (0, f"run {run_id} finished")


async def test_errors_are_reported_in_words(stack: InProcessStack, stack_dir: Path) -> None:
    code, _, err = await _runwire("get", "no-such-run", cwd=stack_dir, env=_clean_env())
    assert code == 1
    assert "NOT_FOUND" in err

    env = {**_clean_env(), "RUNWIRE_NATS_URL": "nats://127.0.0.1:1"}
    code, _, err = await _runwire("get", "x", cwd=stack_dir, env=env)
    assert code == 1
    assert "cannot reach NATS" in err


async def test_budget_sets_and_shows_the_tenants_limits(
    stack: InProcessStack, stack_dir: Path
) -> None:
    code, out, err = await _runwire(
        "budget",
        "--tokens",
        "5000",
        "--cost",
        "700",
        "--max-active-runs",
        "3",
        cwd=stack_dir,
        env=_clean_env(),
    )
    assert code == 0, err
    assert json.loads(out) | {"active_runs": 0, "runs_today": 0} == {
        "tenant": "default",
        "tokens": 5000,
        "used": 0,
        "reserved": 0,
        "left": 5000,
        "cost": 700,
        "cost_used": 0,
        "cost_reserved": 0,
        "cost_left": 700,
        "max_active_runs": 3,
        "max_runs_per_day": None,
        "active_runs": 0,
        "runs_today": 0,
        # Its share of executor slots and its queue, at the stack's defaults.
        "share": None,
        "share_runs": 64,
        "issued_runs": 0,
        "max_queued_runs": 10000,
        "queued_runs": 0,
        "rate_limited_runs": 0,
        "max_runs_per_key": None,
    }
    code, out, err = await _runwire("budget", "--tokens", "none", cwd=stack_dir, env=_clean_env())
    assert code == 0, err
    shown = json.loads(out)
    assert (shown["tokens"], shown["left"], shown["max_active_runs"]) == (None, None, 3)


async def test_policy_sets_and_shows_the_effect_kinds_a_tenant_may_perform(
    stack: InProcessStack, stack_dir: Path
) -> None:
    code, out, err = await _runwire("policy", cwd=stack_dir, env=_clean_env())
    assert code == 0, err
    # Never set: no effect kind at all.
    assert json.loads(out) == {"tenant": "default", "effects": [], "version": 0}
    code, out, err = await _runwire(
        "policy", "--effects", "http, noop", cwd=stack_dir, env=_clean_env()
    )
    assert code == 0, err
    assert json.loads(out) == {"tenant": "default", "effects": ["http", "noop"], "version": 1}
    # Another tenant's, as the command that an effect's refusal names spells it.
    code, out, err = await _runwire(
        "--tenant", "acme", "policy", "--effects", "http", cwd=stack_dir, env=_clean_env()
    )
    assert code == 0, err
    assert json.loads(out) == {"tenant": "acme", "effects": ["http"], "version": 1}
    code, out, err = await _runwire("policy", "--effects", "any", cwd=stack_dir, env=_clean_env())
    assert code == 0, err
    assert json.loads(out)["effects"] is None
    code, out, err = await _runwire(
        "policy", "--effects", "Not A Kind", cwd=stack_dir, env=_clean_env()
    )
    assert code != 0
    assert "effect kind" in err or "pattern" in err


async def test_release_submit_and_the_node_tree_of_a_workflow(
    stack: InProcessStack, stack_dir: Path
) -> None:
    env = _clean_env()
    definition = {
        "nodes": [
            {
                "id": "draft",
                "runner": "scripted",
                "input": {
                    "tokens": ["x"],
                    "fail": [{"attempt": 1, "after_tokens": 0, "kind": "fatal"}],
                },
                "on_failure": "fallback",
                "fallback": "backup",
            },
            {"id": "backup", "runner": "scripted", "input": {"tokens": ["b"]}},
            {"id": "send", "runner": "scripted", "input": {"tokens": [{"$ref": "input.to"}]}},
        ],
        "edges": [{"from": "draft", "to": "send"}],
    }
    (stack_dir / "flow.json").write_text(json.dumps(definition))
    code, out, err = await _runwire("release", "flow", "1", "flow.json", cwd=stack_dir, env=env)
    assert code == 0, err
    assert out.startswith("release flow v1: published (3 nodes, digest ")
    code, out, err = await _runwire("release", "flow", "1", "flow.json", cwd=stack_dir, env=env)
    assert "already published, unchanged" in out

    code, out, err = await _runwire(
        "submit", "--workflow", "flow", "--input", '{"to": "ada"}', cwd=stack_dir, env=env
    )
    assert code == 0, err
    run_id = out.split()[1]
    code, out, err = await _runwire("get", run_id, "--nodes", "--watch", cwd=stack_dir, env=env)
    assert code == 0, err
    # The last tree: the fallback under the node it stands in for.
    last = out.strip().split("\n")[-4:]
    assert last[0] == f"run {run_id} finished (release flow v1)"
    assert last[1].split() == ["draft", "failed", "attempt", "1", "RUNNER_FATAL"]
    assert last[2].split() == [
        "└─",
        "backup",
        "completed",
        "attempt",
        "1",
        "(in",
        "place",
        "of",
        "draft)",
    ]
    assert last[3].split() == ["send", "completed", "attempt", "1"]

    (stack_dir / "cyclic.json").write_text(
        json.dumps({"nodes": definition["nodes"][:1], "edges": [{"from": "draft", "to": "draft"}]})
    )
    code, _, err = await _runwire("release", "loop", "1", "cyclic.json", cwd=stack_dir, env=env)
    assert code == 2
    assert "cycle" in err


async def test_watching_a_workflow_runs_nodes_prints_each_tree_once(
    stack: InProcessStack, stack_dir: Path
) -> None:
    env = _clean_env()
    definition = {
        "nodes": [
            {"id": "greet", "runner": "scripted", "input": {"tokens": ["hi"]}},
            {
                "id": "sign",
                "runner": "scripted",
                "input": {"tokens": ["a", "b", "c"], "token_delay_ms": 200},
            },
        ],
        "edges": [{"from": "greet", "to": "sign"}],
    }
    await stack.client.release("greeting", 1, definition)
    reply = await stack.client.submit_workflow("greeting", {})
    run_id = reply.run.run_id

    # While it runs: a tree each time it changes, never the same one twice in a row.
    code, out, err = await _runwire("get", run_id, "--nodes", "--watch", cwd=stack_dir, env=env)
    assert code == 0, err
    trees = [tree for tree in re.split(r"^(?=run )", out, flags=re.MULTILINE) if tree]
    assert all(before != after for before, after in itertools.pairwise(trees)), out
    last = trees[-1].strip().split("\n")
    assert last[0] == f"run {run_id} finished (release greeting v1)"
    assert [line.split()[:2] for line in last[1:]] == [
        ["greet", "completed"],
        ["sign", "completed"],
    ]

    # Once it has ended: its tree, once.
    code, out, err = await _runwire("get", run_id, "--nodes", "--watch", cwd=stack_dir, env=env)
    assert code == 0, err
    assert out == trees[-1]


async def test_a_settings_file_named_with_env_wins_over_the_shells_identity(
    broker: Broker, secured: InProcessStack, tmp_path: Path
) -> None:
    where = {"RUNWIRE_NATS_URL": broker.server.url, "RUNWIRE_PREFIX": broker.subjects.prefix}
    passwords = broker.identities.passwords
    write_env_file(
        tmp_path / "operator.env",
        {**where, "RUNWIRE_NATS_USER": OPERATOR, "RUNWIRE_NATS_PASSWORD": passwords[OPERATOR]},
    )
    acme = tenant_user("acme")
    write_env_file(
        tmp_path / "acme.env",
        {
            **where,
            "RUNWIRE_TENANT": "acme",
            "RUNWIRE_NATS_USER": acme,
            "RUNWIRE_NATS_PASSWORD": passwords[acme],
        },
    )
    # A shell that sourced the default tenant's settings (`set -a; . .runwire/env`).
    default = tenant_user("default")
    shell = {
        **_clean_env(),
        **where,
        "RUNWIRE_TENANT": "default",
        "RUNWIRE_NATS_USER": default,
        "RUNWIRE_NATS_PASSWORD": passwords[default],
    }

    code, _, err = await _runwire("budget", "--tokens", "5", cwd=tmp_path, env=shell)
    assert (code, "UNAUTHORIZED" in err) == (1, True), err
    code, out, err = await _runwire(
        "--env", "operator.env", "budget", "--tokens", "5", cwd=tmp_path, env=shell
    )
    assert code == 0, err
    assert (json.loads(out)["tenant"], json.loads(out)["tokens"]) == ("default", 5)
    code, out, err = await _runwire(
        "--env", "acme.env", "submit", "--tokens", "mine", "--watch", cwd=tmp_path, env=shell
    )
    assert code == 0, err
    assert out.splitlines()[1] == "mine"
    code, out, err = await _runwire(
        "--env", "acme.env", "get", out.split()[1], cwd=tmp_path, env=shell
    )
    assert code == 0, err
    assert json.loads(out)["tenant"] == "acme"


async def test_health_answers_for_every_replica_and_for_this_host(
    stack: InProcessStack, stack_dir: Path
) -> None:
    # The stack's services run in this process: their instance is this host and pid.
    instance = f"{socket.gethostname()}:{os.getpid()}"
    code, out, err = await _runwire("health", "executor", cwd=stack_dir, env=_clean_env())
    assert code == 0, err
    assert out.split()[:2] == [instance, "ok"]
    assert "postgres ok" in out

    code, out, err = await _runwire(
        "health", "executor", "--local", cwd=stack_dir, env=_clean_env()
    )
    assert code == 0, err
    assert out.startswith(f"{instance}  ok  ")


async def test_health_fails_when_no_replica_answers_here(
    stack: InProcessStack, stack_dir: Path
) -> None:
    # A prefix no service serves: nobody answers.
    elsewhere = {**_clean_env(), "RUNWIRE_PREFIX": f"{stack.prefix}x"}
    code, out, err = await _runwire("health", "executor", cwd=stack_dir, env=elsewhere)
    assert (code, out) == (1, "")
    assert "no replica of executor answered" in err

    # One replica answers there, from another host: it counts, but not for --local.
    async def answer(msg: Msg) -> None:
        reply = HealthReply(
            ok=True,
            service="executor",
            instance="other-pod:7",
            version="0.1.0",
            uptime_s=3.0,
            dependencies={"nats": "ok", "postgres": "ok"},
        )
        await msg.respond(reply.model_dump_json().encode())

    replica = await stack.client.nc.subscribe(
        Subjects(f"{stack.prefix}x").health("executor"), cb=answer
    )
    await stack.client.nc.flush()
    try:
        code, out, err = await _runwire("health", "executor", cwd=stack_dir, env=elsewhere)
        assert code == 0, err
        assert out.startswith("other-pod:7  ok  ")
        code, out, err = await _runwire(
            "health", "executor", "--local", cwd=stack_dir, env=elsewhere
        )
        assert (code, out) == (1, "")
        assert f"no replica of executor on this host ({socket.gethostname()})" in err
    finally:
        await replica.unsubscribe()


async def test_health_refuses_a_service_runwire_does_not_have(stack_dir: Path) -> None:
    code, _, err = await _runwire("health", "scheduler", cwd=stack_dir, env=_clean_env())
    assert code == 2
    assert "invalid choice: 'scheduler'" in err
