"""kill -9 of the executor, and of recovery, at each node transition of a workflow run:
every node's outcome is recorded once, and the run ends as it does without a crash."""

from pathlib import Path
from typing import Any

import pytest

from runwire.contracts.status import RunStatus
from runwire.runtime import faults
from runwire.testing.waiting import eventually
from tests.effect_server import EffectServer
from tests.services import ProcessStack, ServiceProcess, assert_well_formed, collect

pytestmark = pytest.mark.chaos

FATAL = [{"attempt": 1, "after_tokens": 0, "kind": "fatal"}]
RETRY_ONCE = [{"attempt": 1, "after_tokens": 1, "kind": "retryable"}]
ENDED = {"node_completed", "node_failed", "node_fell_back", "node_skipped", "node_timed_out"}


def _node(node_id: str, tokens: list[Any], **spec: Any) -> dict[str, Any]:
    script: dict[str, Any] = {"tokens": tokens}
    for key in ("fail", "token_delay_ms"):
        if key in spec:
            script[key] = spec.pop(key)
    return {"id": node_id, "runner": "scripted", "input": script, **spec}


def _edges(*pairs: str) -> list[dict[str, str]]:
    return [{"from": a, "to": b} for a, _, b in (p.partition(">") for p in pairs)]


# Fan-out, a fallback, a skip, a retry, a fan-in.
FLOW = {
    "nodes": [
        _node("plan", ["plan "]),
        _node("draft", ["x"], on_failure="fallback", fallback="backup", fail=FATAL),
        _node("backup", ["backup "]),
        _node("extra", ["x"], on_failure="skip", fail=FATAL),
        _node("flaky", ["fl", "aky"], fail=RETRY_ONCE, retry={"max_attempts": 3, "backoff_ms": 10}),
        _node("final", [{"$ref": "nodes.draft.text"}, {"$ref": "nodes.flaky.text"}]),
    ],
    "edges": _edges(
        "plan>draft", "plan>extra", "plan>flaky", "draft>final", "extra>final", "flaky>final"
    ),
}
FLOW_NODES = {
    "plan": "completed",
    "draft": "failed",
    "backup": "completed",
    "extra": "skipped",
    "flaky": "completed",
    "final": "completed",
}

# A node past its deadline: its fallback runs in its place.
DEADLINE = {
    "nodes": [
        _node(
            "research",
            ["r"] * 400,
            token_delay_ms=20,
            deadline_ms=1500,
            on_failure="fallback",
            fallback="quick",
        ),
        _node("quick", ["quick"]),
        _node("write", [{"$ref": "nodes.research.text"}, "!"]),
    ],
    "edges": _edges("research>write"),
}
DEADLINE_NODES = {"research": "timed_out", "quick": "completed", "write": "completed"}


async def _stack(env: dict[str, str], tmp_path: Path, recovery_faults: str = "") -> ProcessStack:
    stack = ProcessStack(env, tmp_path)
    stack.start("submitter")
    stack.start("relay")
    stack.start("recovery-a", kind="recovery", fault_points=recovery_faults)
    await stack.open()
    return stack


def _dead(proc: ServiceProcess) -> bool:
    return proc.proc is not None and proc.proc.poll() is not None


async def _run(stack: ProcessStack, name: str, definition: dict[str, Any]) -> str:
    await stack.client.release(name, 1, definition)
    return (await stack.client.submit_workflow(name, {})).run.run_id


async def _check_once(stack: ProcessStack, run_id: str, expected: dict[str, str]) -> Any:
    """The run ended as without a crash; each node ready once and ended once."""
    frames, _ = await collect(stack.client, run_id, timeout=90)
    assert_well_formed(frames)
    run = await stack.client.get(run_id)
    assert run.status == RunStatus.FINISHED, stack.logs()
    assert {n.node_id: n.status.value for n in run.nodes} == expected
    events = [e for e in await stack.store.run_events(run_id) if e["seq"] is not None]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    for node_id in expected:
        mine = [e["event"] for e in events if e["node_id"] == node_id]
        assert mine.count("node_ready") == 1, (node_id, mine)
        assert sum(event in ENDED for event in mine) == 1, (node_id, mine)
    # Exactly one `node` frame says each node ended.
    ended = [
        f.data["node_id"]
        for f in frames
        if f.type == "node" and f.data["status"] not in ("ready", "running", "waiting")
    ]
    assert sorted(ended) == sorted(expected)
    return run


@pytest.mark.parametrize(
    "crash", [None, faults.NODE_CLAIMED, faults.NODE_SETTLED, faults.OUTBOX_COMMITTED]
)
async def test_an_executor_killed_at_a_node_transition_changes_no_outcome(
    crash: str | None, service_env: dict[str, str], tmp_path: Path
) -> None:
    stack = await _stack(service_env, tmp_path)
    try:
        victim = stack.start("executor-a", fault_points=f"{crash}=kill" if crash else "")
        run_id = await _run(stack, "flow", FLOW)
        if crash is not None:
            await eventually(lambda: _dead(victim), timeout=30)
            stack.start("executor-b")
        run = await _check_once(stack, run_id, FLOW_NODES)
        assert run.result is not None
        assert run.result["outputs"]["final"]["text"] == "backup flaky"
    finally:
        await stack.close()


@pytest.mark.parametrize("crash", [None, faults.NODE_TIMED_OUT, faults.OUTBOX_COMMITTED])
async def test_recovery_killed_as_a_node_times_out_times_it_out_once(
    crash: str | None, service_env: dict[str, str], tmp_path: Path
) -> None:
    stack = await _stack(service_env, tmp_path, f"{crash}=kill" if crash else "")
    try:
        stack.start("executor")
        run_id = await _run(stack, "deadline", DEADLINE)
        if crash is not None:
            await eventually(lambda: _dead(stack.procs["recovery-a"]), timeout=30)
            stack.start("recovery-b", kind="recovery")
        run = await _check_once(stack, run_id, DEADLINE_NODES)
        assert run.result is not None
        assert run.result["outputs"]["write"]["text"] == "quick!"
    finally:
        await stack.close()


@pytest.mark.parametrize("crash", [faults.EFFECT_DISPATCHED, faults.EFFECT_COMMITTED])
async def test_an_effect_node_whose_executor_died_completes_from_its_receipt(
    crash: str, service_env: dict[str, str], tmp_path: Path
) -> None:
    async with EffectServer() as server:
        definition = {
            "nodes": [
                _node("draft", ["Shipped."]),
                {
                    "id": "email",
                    "effect": "http",
                    "input": {
                        "url": f"{server.url}/email",
                        "status_url": f"{server.url}/charges/{{idempotency_key}}",
                        "body": {"text": {"$ref": "nodes.draft.text"}},
                    },
                },
            ],
            "edges": _edges("draft>email"),
        }
        stack = await _stack(service_env, tmp_path)
        try:
            await stack.allow_effects("http")
            victim = stack.start("executor-a", fault_points=f"{crash}=kill")
            run_id = await _run(stack, "mail", definition)
            await eventually(lambda: _dead(victim), timeout=30)
            stack.start("executor-b")
            run = await _check_once(stack, run_id, {"draft": "completed", "email": "completed"})
        finally:
            await stack.close()

    # Sent once, and the node's output is the receipt of that one send.
    assert list(server.emails.values()) == [1]
    assert run.result is not None
    assert run.result["outputs"]["email"] == {"text": "", "status": 200, "id": "em_1"}
