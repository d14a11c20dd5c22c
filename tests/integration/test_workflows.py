"""Workflow runs: releases, node runs as their inputs become ready, per-node retry,
fallback, skip and deadline, cancel; against the four services, NATS and Postgres."""

import asyncio
import itertools
import json
import uuid
from typing import Any

import asyncpg
import pytest

from bench.workflows import CHAIN, chain_graph, node_overhead_ms
from runwire.client import Client, ClientError
from runwire.contracts.errors import ErrorCode
from runwire.contracts.events import RunEvent
from runwire.contracts.frames import Frame, FrameType
from runwire.contracts.replies import RunSummary
from runwire.contracts.status import RunStatus
from runwire.contracts.workflows import NodeStatus
from runwire.testing.servers import Servers
from runwire.testing.waiting import eventually
from tests.effect_server import EffectServer
from tests.runners import charge, spend
from tests.services import InProcessStack, assert_well_formed, collect

pytestmark = pytest.mark.integration

FATAL = [{"attempt": 1, "after_tokens": 0, "kind": "fatal"}]


def node(node_id: str, tokens: Any = None, **policy: Any) -> dict[str, Any]:
    """A scripted node emitting `tokens` (a list, or a template)."""
    spec: dict[str, Any] = {"id": node_id, "runner": "scripted"}
    spec["input"] = {"tokens": tokens if tokens is not None else [f"{node_id} "]}
    for key in ("fail", "token_delay_ms"):
        if key in policy:
            spec["input"][key] = policy.pop(key)
    spec.update(policy)
    return spec


def edges(*pairs: str) -> list[dict[str, str]]:
    """`"a>b"` → an edge from a to b."""
    return [{"from": p.split(">")[0], "to": p.split(">")[1]} for p in pairs]


async def run_workflow(
    client: Client, definition: dict[str, Any], input: dict[str, Any] | None = None
) -> tuple[RunSummary, list[Frame]]:
    """Publish `definition` as a new release, run it to its end: the run, its frames."""
    release_id = f"wf-{id(definition)}"
    await client.release(release_id, 1, definition)
    reply = await client.submit_workflow(release_id, input or {})
    frames, _ = await collect(client, reply.run.run_id, timeout=60)
    assert_well_formed(frames)
    return await client.get(reply.run.run_id), frames


def node_frames(frames: list[Frame]) -> list[tuple[str, str]]:
    return [(f.data["node_id"], f.data["action"]) for f in frames if f.type == FrameType.NODE]


def statuses(run: RunSummary) -> dict[str, NodeStatus]:
    return {n.node_id: n.status for n in run.nodes}


async def test_outputs_feed_the_nodes_after_them(stack: InProcessStack) -> None:
    definition = {
        "nodes": [
            node("classify", {"$ref": "input.words"}),
            node("draft", [{"$ref": "nodes.classify.text"}, "-drafted"]),
            node("check", [{"$ref": "nodes.draft.text"}, "-checked"]),
        ],
        "edges": edges("classify>draft", "draft>check"),
    }
    run, frames = await run_workflow(stack.client, definition, {"words": ["a", "b"]})

    assert run.status == RunStatus.FINISHED
    assert run.workflow is not None
    assert run.workflow.version == 1
    assert run.result is not None
    assert run.result["outputs"]["check"]["text"] == "ab-drafted-checked"
    assert statuses(run) == dict.fromkeys(["classify", "draft", "check"], NodeStatus.COMPLETED)
    assert frames[0].type == FrameType.RUN
    assert frames[-1].data == {"status": "finished"}
    assert node_frames(frames) == [
        ("classify", "started"),
        ("classify", "completed"),
        ("draft", "started"),
        ("draft", "completed"),
        ("check", "started"),
        ("check", "completed"),
    ]
    # Each node run is a run of its own: its frames and its parent.
    draft = next(n for n in run.nodes if n.node_id == "draft")
    node_run = await stack.client.get(draft.node_run_id)
    assert node_run.parent_run_id == run.run_id
    assert node_run.node_id == "draft"
    _, transcript = await collect(stack.client, draft.node_run_id)
    assert transcript.text == "ab-drafted"


async def test_a_fallback_chain_ends_with_the_node_that_completes(stack: InProcessStack) -> None:
    definition = {
        "nodes": [
            node("answer", on_failure="fallback", fallback="cheaper", fail=FATAL),
            node("cheaper", on_failure="fallback", fallback="cheapest", fail=FATAL),
            node("cheapest", ["cheapest answer"]),
            node("send", [{"$ref": "nodes.answer.text"}]),
        ],
        "edges": edges("answer>send"),
    }
    run, frames = await run_workflow(stack.client, definition)

    assert run.status == RunStatus.FINISHED
    assert statuses(run) == {
        "answer": NodeStatus.FAILED,
        "cheaper": NodeStatus.FAILED,
        "cheapest": NodeStatus.COMPLETED,
        "send": NodeStatus.COMPLETED,
    }
    # The fallbacks fill the slot of the node they stand in for.
    assert {n.node_id: n.slot for n in run.nodes}["cheapest"] == "answer"
    assert run.result is not None
    assert run.result["outputs"]["send"]["text"] == "cheapest answer"
    assert run.result["outputs"]["answer"]["text"] == "cheapest answer"
    fell_back = [
        f.data for f in frames if f.type == FrameType.NODE and f.data["action"] == "fell_back"
    ]
    assert [(d["node_id"], d["fallback"], d["code"]) for d in fell_back] == [
        ("answer", "cheaper", "RUNNER_FATAL"),
        ("cheaper", "cheapest", "RUNNER_FATAL"),
    ]


async def test_a_skipped_node_lets_the_nodes_after_it_run(stack: InProcessStack) -> None:
    definition = {
        "nodes": [
            node("enrich", on_failure="skip", fail=FATAL),
            node("reply", ["replied"]),
        ],
        "edges": edges("enrich>reply"),
    }
    run, frames = await run_workflow(stack.client, definition)

    assert run.status == RunStatus.FINISHED
    assert statuses(run) == {"enrich": NodeStatus.SKIPPED, "reply": NodeStatus.COMPLETED}
    assert ("enrich", "skipped") in node_frames(frames)
    skipped = next(n for n in run.nodes if n.node_id == "enrich")
    assert skipped.error is not None
    assert skipped.error["code"] == "RUNNER_FATAL"
    # A skipped node's output is null; the nodes after it ran.
    assert run.result is not None
    assert run.result["outputs"] == {"enrich": None, "reply": {"text": "replied"}}


async def test_retries_follow_the_node_policy_then_the_run_fails(stack: InProcessStack) -> None:
    always = [{"attempt": a, "after_tokens": 0, "kind": "retryable"} for a in (1, 2)]
    definition = {
        "nodes": [
            node("flaky", fail=always, retry={"max_attempts": 2, "backoff_ms": 10}),
            node("slow", ["s"] * 200, token_delay_ms=20),
            node("after", ["x"]),
        ],
        "edges": edges("flaky>after", "slow>after"),
    }
    run, frames = await run_workflow(stack.client, definition)

    assert run.status == RunStatus.FAILED
    assert run.error is not None
    assert run.error.code == ErrorCode.NODE_FAILED
    assert "flaky" in run.error.message
    assert frames[-1].data == {"status": "failed", "code": "NODE_FAILED"}
    flaky = [a for n, a in node_frames(frames) if n == "flaky"]
    assert flaky == ["started", "retrying", "started", "failed"]
    # The node still running when the run failed was stopped; `after` never ran.
    assert statuses(run) == {"flaky": NodeStatus.FAILED, "slow": NodeStatus.FAILED}
    slow = next(n for n in run.nodes if n.node_id == "slow")
    assert slow.error is not None
    assert slow.error["code"] == "CANCELED"
    stopped = await eventually(lambda: _ended(stack.client, slow.node_run_id), timeout=20)
    assert stopped.status == RunStatus.CANCELED


async def test_a_fail_run_node_fails_the_run_without_retrying(stack: InProcessStack) -> None:
    flaky = [{"attempt": 1, "after_tokens": 0, "kind": "retryable"}]
    definition = {"nodes": [node("strict", on_failure="fail_run", fail=flaky)]}
    run, frames = await run_workflow(stack.client, definition)
    assert run.status == RunStatus.FAILED
    assert [a for _, a in node_frames(frames)] == ["started", "failed"]
    assert run.nodes[0].attempt == 1


async def test_a_deadline_times_a_long_node_out_once(stack: InProcessStack) -> None:
    definition = {
        "nodes": [
            node(
                "research",
                ["r"] * 500,
                token_delay_ms=20,
                deadline_ms=600,
                on_failure="fallback",
                fallback="quick",
            ),
            node("quick", ["quick"]),
            node("write", [{"$ref": "nodes.research.text"}, "!"]),
        ],
        "edges": edges("research>write"),
    }
    run, frames = await run_workflow(stack.client, definition)

    assert run.status == RunStatus.FINISHED
    assert statuses(run)["research"] == NodeStatus.TIMED_OUT
    assert run.result is not None
    assert run.result["outputs"]["write"]["text"] == "quick!"
    timed_out = [
        f.data for f in frames if f.type == FrameType.NODE and f.data["action"] == "timed_out"
    ]
    assert len(timed_out) == 1
    assert timed_out[0]["code"] == "NODE_DEADLINE_EXCEEDED"
    research = next(n for n in run.nodes if n.node_id == "research")
    # Its run was stopped, and its end changed nothing more: one timed_out event.
    stopped = await eventually(lambda: _ended(stack.client, research.node_run_id), timeout=20)
    assert stopped.status == RunStatus.CANCELED
    events = await stack.store.run_events(run.run_id)
    assert [e["event"] for e in events if e["node_id"] == "research"].count("node_timed_out") == 1


async def test_a_deadline_with_fail_run_fails_the_run(stack: InProcessStack) -> None:
    definition = {"nodes": [node("hang", ["h"] * 500, token_delay_ms=20, deadline_ms=400)]}
    run, _frames = await run_workflow(stack.client, definition)
    assert run.status == RunStatus.FAILED
    assert run.error is not None
    assert run.error.code == ErrorCode.NODE_DEADLINE_EXCEEDED
    assert statuses(run) == {"hang": NodeStatus.TIMED_OUT}


async def test_fan_out_of_twenty_and_a_fan_in(stack: InProcessStack) -> None:
    leaves = [f"part-{i}" for i in range(20)]
    definition = {
        "nodes": [
            node("split"),
            *(node(leaf, [f"{leaf};"]) for leaf in leaves),
            node("join", [{"$ref": f"nodes.{leaf}.text"} for leaf in leaves]),
        ],
        "edges": edges(*(f"split>{leaf}" for leaf in leaves), *(f"{leaf}>join" for leaf in leaves)),
    }
    run, frames = await run_workflow(stack.client, definition)

    assert run.status == RunStatus.FINISHED
    assert run.result is not None
    assert run.result["outputs"]["join"]["text"] == "".join(f"{leaf};" for leaf in leaves)
    started = [n for n, a in node_frames(frames) if a == "started"]
    assert started[0] == "split"
    assert started[-1] == "join"
    assert len(started) == 22
    # The twenty ran side by side: all of them were ready before any of them completed.
    events = await stack.store.run_events(run.run_id)
    ready = [e["seq"] for e in events if e["event"] == "node_ready" and e["node_id"] in leaves]
    completed = [
        e["seq"] for e in events if e["event"] == "node_completed" and e["node_id"] in leaves
    ]
    assert max(ready) < min(completed)


async def test_node_events_are_numbered_once_each_with_times_in_order(
    stack: InProcessStack,
) -> None:
    definition = {
        "nodes": [
            node("a"),
            node("b", fail=[{"attempt": 1, "after_tokens": 0, "kind": "retryable"}]),
            node("c"),
        ],
        "edges": edges("a>c", "b>c"),
    }
    seen: list[RunEvent] = []
    subscription = await stack.client.events()  # subscribed from here on

    async def follow() -> None:
        async for event in subscription:
            seen.append(event)

    follower = asyncio.create_task(follow())
    run, _ = await run_workflow(stack.client, definition)
    assert run.status == RunStatus.FINISHED
    events = [e for e in await stack.store.run_events(run.run_id) if e["seq"] is not None]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert all(x["at"] <= y["at"] for x, y in itertools.pairwise(events))
    keys = [e["idempotency_key"] for e in events]
    assert len(keys) == len(set(keys))
    b = next(n for n in run.nodes if n.node_id == "b")
    assert f"retrying:{b.node_run_id}:1" in keys
    assert f"started:{b.node_run_id}:2" in keys
    names = {e["event"] for e in events}
    assert {"node_ready", "node_started", "node_retrying", "node_completed"} <= names
    # The same events reach subscribers, with the node and the number.

    def published() -> list[tuple[int | None, str | None, str]]:
        mine = [(e.seq, e.node, e.event.value) for e in seen if e.run_id == run.run_id]
        assert len([m for m in mine if m[0] is not None]) == len(events)
        return mine

    try:
        mine = await eventually(published, timeout=20)
    finally:
        follower.cancel()
    assert [m for m in mine if m[0] is not None] == [
        (e["seq"], e["node_id"], e["event"]) for e in events
    ]


@pytest.mark.parametrize("stop", ["cancel", "abort_session"])
async def test_cancel_and_abort_session_stop_every_running_node(
    stop: str, stack: InProcessStack
) -> None:
    definition = {"nodes": [node(f"long-{i}", ["t"] * 1000, token_delay_ms=20) for i in range(3)]}
    await stack.client.release("long", 1, definition)
    reply = await stack.client.submit_workflow("long", {}, session_id="chat-1")

    async def all_running() -> bool:
        run = await stack.client.get(reply.run.run_id)
        return len(run.nodes) == 3 and all(n.status == NodeStatus.RUNNING for n in run.nodes)

    await eventually(all_running, timeout=20)
    if stop == "cancel":
        canceled = await stack.client.cancel(reply.run.run_id)
        assert canceled.status == RunStatus.CANCELED
    else:
        assert await stack.client.abort_session("chat-1") == [reply.run.run_id]
    frames, _ = await collect(stack.client, reply.run.run_id)
    assert frames[-1].data == {"status": "canceled", "code": "CANCELED"}
    assert [a for _, a in node_frames(frames)][-3:] == ["failed"] * 3
    run = await stack.client.get(reply.run.run_id)
    for n in run.nodes:
        stopped = await eventually(lambda n=n: _ended(stack.client, n.node_run_id), timeout=10)
        assert stopped.status == RunStatus.CANCELED


async def test_a_nodes_input_that_cannot_fit_its_runner_is_refused_at_publish(
    stack: InProcessStack,
) -> None:
    # `tokens` must be a list of strings: a run of it could only fail, attempt after attempt.
    bad = {"nodes": [node("draft"), node("check", "not a list")], "edges": edges("draft>check")}
    with pytest.raises(ClientError) as refused:
        await stack.client.release("checked", 1, bad)
    # What a `$ref` stands for is known only when the node runs: any value will do now.
    fine = {
        "nodes": [node("draft"), node("check", [{"$ref": "nodes.draft.text"}, "!"])],
        "edges": edges("draft>check"),
    }
    published = await stack.client.release("checked", 1, fine)

    assert (refused.value.code, refused.value.retryable) == (ErrorCode.INVALID_REQUEST, False)
    assert "node 'check'" in refused.value.message
    assert "tokens" in refused.value.message
    assert published.created


async def test_a_release_is_checked_and_never_changes(stack: InProcessStack) -> None:
    good = {"nodes": [node("a"), node("b")], "edges": edges("a>b")}
    first = await stack.client.release("support", 1, good)
    assert first.created
    assert first.nodes == 2
    again = await stack.client.release("support", 1, good)
    assert not again.created
    assert again.digest == first.digest

    with pytest.raises(ClientError) as changed:
        await stack.client.release("support", 1, {"nodes": [node("a")]})
    assert changed.value.code == ErrorCode.INVALID_REQUEST
    assert not changed.value.retryable
    assert "new version" in changed.value.message

    with pytest.raises(ClientError) as unknown:
        await stack.client.release("support", 2, {"nodes": [{"id": "a", "runner": "nope"}]})
    assert unknown.value.code == ErrorCode.INVALID_REQUEST
    assert "node 'a'" in unknown.value.message
    assert "unknown runner 'nope'" in unknown.value.message

    # A cycle, sent as any client of the wire would: refused, saying why.
    cyclic = {
        "release_id": "loop",
        "version": 1,
        "definition": {"nodes": [node("a"), node("b")], "edges": edges("a>b", "b>a")},
    }
    msg = await stack.client.nc.request(
        stack.client.subjects.command("default", "release"), json.dumps(cyclic).encode(), 10
    )
    refused = json.loads(msg.data)
    assert refused["ok"] is False
    assert refused["error"]["code"] == "INVALID_REQUEST"
    assert refused["error"]["retryable"] is False
    assert "cycle" in refused["error"]["message"]

    with pytest.raises(ClientError) as missing:
        await stack.client.submit_workflow("absent", {})
    assert missing.value.code == ErrorCode.NOT_FOUND

    # A later version is what a submit without a version runs.
    await stack.client.release("support", 2, {"nodes": [node("only")]})
    reply = await stack.client.submit_workflow("support", {})
    assert reply.run.workflow is not None
    assert reply.run.workflow.version == 2


async def _ended(client: Client, run_id: str) -> RunSummary | None:
    run = await client.get(run_id)
    return (
        run
        if run.status not in (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.RECOVERING)
        else None
    )


async def test_a_hundred_nodes_finish_on_two_executors(stack: InProcessStack) -> None:
    stack.start_executor("executor-1")
    layers = [[f"n{layer}-{i}" for i in range(10)] for layer in range(10)]
    nodes = [node(n, [f"{n} "]) for layer in layers for n in layer]
    links = [
        f"{a}>{b}" for upper, lower in itertools.pairwise(layers) for a in upper for b in lower
    ]
    run, _frames = await asyncio.wait_for(
        run_workflow(stack.client, {"nodes": nodes, "edges": edges(*links)}), 120
    )
    assert run.status == RunStatus.FINISHED
    assert len(run.nodes) == 100
    assert set(statuses(run).values()) == {NodeStatus.COMPLETED}
    # Both executors ran nodes.
    owners = {
        e["actor"] for e in await stack.store.run_events(run.run_id) if e["event"] == "node_started"
    }
    assert owners == {"executor-0", "executor-1"}


async def test_an_effect_node_sends_what_the_node_before_it_wrote_once(
    stack: InProcessStack,
) -> None:
    await stack.allow_effects("http")
    async with EffectServer() as server:
        definition = {
            "nodes": [
                node("draft", ["Your order ", "has shipped."]),
                {
                    "id": "email",
                    "effect": "http",
                    "input": {
                        "url": {"$ref": "input.mail_url"},
                        "body": {"to": {"$ref": "input.to"}, "text": {"$ref": "nodes.draft.text"}},
                    },
                },
                # The receipt is the effect node's output: its id is `nodes.email.id`.
                node("log", [{"$ref": "nodes.email.id"}]),
            ],
            "edges": edges("draft>email", "email>log"),
        }
        run, _ = await run_workflow(
            stack.client, definition, {"mail_url": f"{server.url}/email", "to": "ada@example.com"}
        )

    assert run.status == RunStatus.FINISHED
    assert list(server.emails.values()) == [1]
    assert server.sent == {"em_1": {"to": "ada@example.com", "text": "Your order has shipped."}}
    assert run.result is not None
    assert run.result["outputs"]["email"] == {"text": "", "status": 200, "id": "em_1"}
    assert run.result["outputs"]["log"]["text"] == "em_1"
    email = next(n for n in run.nodes if n.node_id == "email")
    node_run = await stack.client.get(email.node_run_id)
    assert [(e.key, e.state.value) for e in node_run.effects] == [("node", "committed")]


async def test_the_node_runs_share_the_workflow_runs_budget(
    infra: Servers, db_url: str, prefix: str
) -> None:
    spend_60 = {"reserve": 60, "use": 60, "hold_ms": 0}
    definition = {
        "nodes": [
            {"id": "first", "runner": "spend", "input": spend_60},
            {"id": "second", "runner": "spend", "input": spend_60, "on_failure": "skip"},
        ],
        "edges": edges("first>second"),
    }
    async with InProcessStack(
        infra.nats_url, db_url, prefix, runners={"spend": spend}, db_roles=infra.service_roles
    ) as stack:
        await stack.client.release("costly", 1, definition)
        reply = await stack.client.submit_workflow("costly", {}, budget_tokens=100)
        await collect(stack.client, reply.run.run_id, timeout=60)
        run = await stack.client.get(reply.run.run_id)

    assert run.status == RunStatus.FINISHED
    assert statuses(run) == {"first": NodeStatus.COMPLETED, "second": NodeStatus.SKIPPED}
    second = next(n for n in run.nodes if n.node_id == "second")
    # 60 of the workflow run's 100 tokens were spent by the first node: 40 are left.
    assert second.error is not None
    assert second.error["code"] == "BUDGET_EXCEEDED"
    assert "40" in second.error["message"]


async def test_the_benchs_overhead_per_node_is_what_a_chain_spends_outside_its_nodes(
    stack: InProcessStack, db_url: str
) -> None:
    # The workflow bench's figure, from a chain run here: never negative (it once printed
    # -8.9 ms, a chain's time per node less a bare run's, which pays a submit and a join).
    await stack.client.release("bench-chain", 1, chain_graph())
    reply = await stack.client.submit_workflow("bench-chain", {})
    await collect(stack.client, reply.run.run_id, timeout=60)
    conn = await asyncpg.connect(db_url)
    try:
        total, overhead = await node_overhead_ms(conn, reply.run.run_id)
        inside = await conn.fetchval(
            "SELECT extract(epoch FROM sum(ended_at - started_at)) * 1000 FROM runs"
            " WHERE parent_run_id = $1",
            uuid.UUID(reply.run.run_id),
        )
    finally:
        await conn.close()

    assert 0 <= overhead < total / CHAIN
    assert overhead * CHAIN + float(inside) == pytest.approx(total)


async def test_a_node_that_charged_does_not_fall_back_unless_it_says_so(
    infra: Servers, db_url: str, prefix: str
) -> None:
    def charging(node_id: str, fail: int = 0) -> dict[str, Any]:
        # Charges through the fence, then (fail=1) fails on its only attempt.
        script = {
            "url": {"$ref": "input.url"},
            "status_url": {"$ref": "input.status_url"},
            "amount": 40,
            "fail_after_charge_on_attempt": fail,
        }
        return {"id": node_id, "runner": "charge", "input": script, "retry": {"max_attempts": 1}}

    def graph(**opt_in: Any) -> dict[str, Any]:
        pay = {**charging("pay", fail=1), "on_failure": "fallback", "fallback": "backup"}
        return {"nodes": [{**pay, **opt_in}, charging("backup")]}

    async with (
        EffectServer() as server,
        InProcessStack(
            infra.nats_url, db_url, prefix, runners={"charge": charge}, db_roles=infra.service_roles
        ) as stack,
    ):
        await stack.allow_effects("http")
        where = {
            "url": f"{server.url}/charge",
            "status_url": f"{server.url}/charges/{{idempotency_key}}",
        }
        plain, opted_in = graph(), graph(fallback_after_effect=True)
        guarded, _ = await run_workflow(stack.client, plain, where)
        charged_once = sum(server.charges.values())
        allowed, _ = await run_workflow(stack.client, opted_in, where)

    assert guarded.status == RunStatus.FAILED
    assert guarded.error is not None
    assert guarded.error.code == ErrorCode.NODE_FAILED
    assert "performed effect charge" in guarded.error.message
    assert statuses(guarded) == {"pay": NodeStatus.FAILED}  # backup never ran
    assert charged_once == 1
    # Opted in: the fallback runs (and charges again, as its node asked).
    assert allowed.status == RunStatus.FINISHED
    assert statuses(allowed) == {"pay": NodeStatus.FAILED, "backup": NodeStatus.COMPLETED}
    assert sum(server.charges.values()) == 3
