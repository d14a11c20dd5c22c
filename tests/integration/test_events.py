"""Run events: every transition is published after its commit, in order."""

import asyncio

import pytest

from runwire.contracts.events import RunEvent
from runwire.contracts.health import HealthReply
from runwire.testing.waiting import eventually
from tests.services import InProcessStack, collect

pytestmark = pytest.mark.integration


async def test_every_transition_of_a_retried_run_is_published_in_order(
    stack: InProcessStack,
) -> None:
    seen: list[RunEvent] = []
    events = await stack.client.events()  # subscribed from here on

    async def follow() -> None:
        async for event in events:
            seen.append(event)

    follower = asyncio.create_task(follow())
    script = {
        "tokens": ["a", "b", "c"],
        "fail": [{"attempt": 1, "after_tokens": 1, "kind": "retryable"}],
    }
    reply = await stack.client.submit(script)
    await collect(stack.client, reply.run.run_id)

    expected = ["submitted", "claimed", "retry", "claimed", "finished"]
    await eventually(lambda: [e.event for e in seen] == expected, timeout=10)
    follower.cancel()
    assert {e.run_id for e in seen} == {reply.run.run_id}
    assert [e.attempt for e in seen] == [0, 1, 1, 2, 2]
    assert seen[2].code == "RUNNER_ERROR"
    assert seen[-1].status == "finished"
    # The same events are kept in the RW_EVENTS stream for late readers.
    js = stack.client.nc.jetstream()
    info = await js.stream_info(stack.client.subjects.events_stream)
    assert info.state.messages == len(expected)


@pytest.mark.parametrize("service", ["submitter", "executor", "relay", "recovery"])
async def test_each_service_answers_health(stack: InProcessStack, service: str) -> None:
    msg = await stack.client.nc.request(stack.client.subjects.health(service), b"", timeout=5)
    health = HealthReply.model_validate_json(msg.data)
    assert health.ok is True
    assert health.service == service
    assert health.dependencies == {"nats": "ok", "postgres": "ok"}
    assert health.uptime_s >= 0
