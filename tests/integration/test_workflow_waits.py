"""Workflow nodes that wait: a node whose runner asks waits (holding no executor) until
its node run is answered; a `signal` node waits for the signal of its name sent to the
workflow run, kept for it when sent before it waits; a node's deadline ends a wait as
`timed_out`, once. Against the services, NATS and Postgres."""

import asyncio
import uuid
from typing import Any

import asyncpg
import pytest

from runwire.client import Client, ClientError
from runwire.client.cli_views import node_tree
from runwire.contracts.errors import ErrorCode
from runwire.contracts.frames import Frame, FrameType
from runwire.contracts.replies import RunSummary
from runwire.contracts.status import RunStatus
from runwire.contracts.workflows import NodeRunData, NodeStatus
from runwire.testing.waiting import eventually
from tests.services import InProcessStack, assert_well_formed, collect

pytestmark = pytest.mark.integration

WAITING_NODES = pytest.mark.stack(runners="asks=tests.waiting:asks", recovery_interval_ms=100)


async def start(client: Client, definition: dict[str, Any], release_id: str) -> str:
    """Publish `definition` and submit a run of it: the workflow run's id."""
    await client.release(release_id, 1, definition)
    return (await client.submit_workflow(release_id, {})).run.run_id


async def waiting_node(client: Client, run_id: str, node_id: str) -> NodeRunData:
    """Node `node_id` of workflow run `run_id` once its run waits."""

    async def waits() -> NodeRunData | None:
        run = await client.get(run_id)
        assert run.status == RunStatus.RUNNING, run.error
        found = [n for n in run.nodes if n.node_id == node_id]
        return found[0] if found and found[0].status == NodeStatus.WAITING else None

    node = await eventually(waits, timeout=20)
    assert node is not None
    return node


async def finish(client: Client, run_id: str) -> tuple[RunSummary, list[Frame]]:
    frames, _ = await collect(client, run_id, timeout=60)
    assert_well_formed(frames)
    return await client.get(run_id), frames


def actions(frames: list[Frame], node_id: str) -> list[str]:
    return [
        f.data["action"]
        for f in frames
        if f.type == FrameType.NODE and f.data["node_id"] == node_id
    ]


@WAITING_NODES
async def test_a_node_that_asks_waits_and_goes_on_with_the_answer(stack: InProcessStack) -> None:
    client = stack.client
    definition = {
        "nodes": [
            {"id": "ask", "runner": "asks", "input": {}},
            {
                "id": "sign",
                "runner": "scripted",
                "input": {"tokens": [{"$ref": "nodes.ask.text"}, " (signed)"]},
            },
        ],
        "edges": [{"from": "ask", "to": "sign"}],
    }
    run_id = await start(client, definition, "asks-then-signs")
    ask = await waiting_node(client, run_id, "ask")
    # What it waits for is in `get`, and its own run waits, holding no executor.
    assert ask.waiting_for is not None
    assert ask.waiting_for["kind"] == "interrupt"
    assert ask.waiting_for["payload"] == {"question": "may I?"}
    assert (await client.get(ask.node_run_id)).status == RunStatus.WAITING
    # `runwire get RUN_ID --nodes` says what it asks and how to answer.
    tree = node_tree(await client.get(run_id))
    assert f'asks {{"question": "may I?"}}: runwire resume {ask.node_run_id}' in tree

    await client.resume(ask.node_run_id, {"say": "yes"})
    run, frames = await finish(client, run_id)

    assert run.status == RunStatus.FINISHED, run.error
    assert run.result is not None
    assert run.result["outputs"]["sign"]["text"] == "hello you said yes (signed)"
    assert actions(frames, "ask") == ["started", "waiting", "resumed", "started", "completed"]
    waiting = next(
        f.data for f in frames if f.type == FrameType.NODE and f.data["action"] == "waiting"
    )
    assert waiting["reason"].startswith("its run asks: ")
    events = [e["event"] for e in await stack.store.run_events(run_id) if e["node_id"] == "ask"]
    assert events.count("node_waiting") == 1
    assert events.count("node_resumed") == 1


@WAITING_NODES
async def test_a_signal_node_takes_the_signal_sent_to_its_workflow_run(
    stack: InProcessStack,
) -> None:
    client = stack.client
    definition = {
        "nodes": [
            {"id": "order", "runner": "scripted", "input": {"tokens": ["ordered "]}},
            {"id": "paid", "signal": "payment"},
            {
                "id": "thank",
                "runner": "scripted",
                "input": {"tokens": ["thanks for ", {"$ref": "nodes.paid.amount"}]},
            },
        ],
        "edges": [{"from": "order", "to": "paid"}, {"from": "paid", "to": "thank"}],
    }
    await client.release("pays", 1, definition)

    # Sent before the node exists: the workflow run keeps it, and the node takes it.
    early = (await client.submit_workflow("pays", {})).run.run_id
    payment = {"amount": "5 EUR"}
    kept = await client.signal(early, "payment", payment, request_id="pay-early")
    assert not kept.delivered
    assert (await client.signal(early, "payment", payment, request_id="pay-early")).duplicate
    run, frames = await finish(client, early)
    assert run.status == RunStatus.FINISHED, run.error
    assert run.result is not None
    assert run.result["outputs"]["paid"] == {"text": "", "amount": "5 EUR"}
    assert run.result["outputs"]["thank"]["text"] == "thanks for 5 EUR"
    assert "resumed" not in actions(frames, "paid")  # it never had to wait

    # Sent while the node waits: it is woken at once.
    late = (await client.submit_workflow("pays", {})).run.run_id
    paid = await waiting_node(client, late, "paid")
    assert paid.waiting_for is not None
    assert (paid.waiting_for["kind"], paid.waiting_for["name"]) == ("signal", "payment")
    tree = node_tree(await client.get(late))
    assert f"waits for the signal payment: runwire signal {late} payment" in tree
    assert (await client.signal(late, "payment", {"amount": "7 EUR"})).delivered
    run, frames = await finish(client, late)
    assert run.status == RunStatus.FINISHED, run.error
    assert run.result is not None
    assert run.result["outputs"]["thank"]["text"] == "thanks for 7 EUR"
    assert actions(frames, "paid") == ["started", "waiting", "resumed", "started", "completed"]
    # The run took one signal and has ended: another is refused.
    with pytest.raises(ClientError) as ended:
        await client.signal(late, "payment", {"amount": "1 EUR"})
    assert ended.value.code == ErrorCode.NOT_WAITING


@WAITING_NODES
async def test_signals_racing_the_nodes_that_wait_for_them_are_each_taken_once(
    stack: InProcessStack,
) -> None:
    client = stack.client
    voters = [f"v{i}" for i in range(12)]
    definition = {"nodes": [{"id": v, "signal": "vote"} for v in voters]}
    run_id = await start(client, definition, "votes")
    # Sent while the node runs are created, claimed and begin to wait, side by side.
    sent = [
        client.signal(run_id, "vote", {"n": i}, request_id=f"vote-{i}") for i in range(len(voters))
    ]
    await asyncio.gather(*sent)
    run, _ = await finish(client, run_id)

    assert run.status == RunStatus.FINISHED, run.error
    assert run.result is not None
    taken = sorted(run.result["outputs"][v]["n"] for v in voters)
    assert taken == list(range(len(voters)))
    conn = await asyncpg.connect(stack.db_url)
    try:
        mailbox = await conn.fetch(
            "SELECT taken_by FROM run_signals WHERE run_id = $1", uuid.UUID(run.run_id)
        )
    finally:
        await conn.close()
    # Each signal went to one node run, and each node run took one.
    takers = [row["taken_by"].split("/")[0] for row in mailbox]
    assert len(takers) == len(set(takers)) == len(voters)


@WAITING_NODES
async def test_a_waiting_node_past_its_deadline_times_out_once(stack: InProcessStack) -> None:
    client = stack.client
    definition = {
        "nodes": [
            {"id": "approval", "signal": "approved", "deadline_ms": 1500, "on_failure": "skip"},
            {"id": "after", "runner": "scripted", "input": {"tokens": ["went on"]}},
        ],
        "edges": [{"from": "approval", "to": "after"}],
    }
    run_id = await start(client, definition, "approval-or-not")
    approval = await waiting_node(client, run_id, "approval")
    run, frames = await finish(client, run_id)

    assert run.status == RunStatus.FINISHED, run.error
    assert run.result is not None
    assert run.result["outputs"]["approval"] is None
    assert run.result["outputs"]["after"]["text"] == "went on"
    assert actions(frames, "approval") == ["started", "waiting", "timed_out"]
    # Its run, which waited, was ended at once: canceled, with its own closing frames.
    stopped = await client.get(approval.node_run_id)
    assert stopped.status == RunStatus.CANCELED
    node_frames, _ = await collect(client, approval.node_run_id)
    assert node_frames[-1].type == FrameType.DONE
    events = await stack.store.run_events(run_id)
    timed_out = [e for e in events if e["node_id"] == "approval" and e["event"] == "node_timed_out"]
    assert len(timed_out) == 1
