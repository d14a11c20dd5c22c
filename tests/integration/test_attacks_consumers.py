"""Attacks through JetStream consumers: a tenant may create consumers on its own runs'
frames and events, and the broker does not check where such a consumer delivers:
nats-server refuses only a deliver subject its own stream stores (a cycle), so a
consumer of a tenant's events may deliver into another tenant's frames subject. A
client following a run takes only that run's frames, wherever messages come from."""

import asyncio
import logging

import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from runwire.contracts.frames import FrameType
from runwire.contracts.subjects import inbox_prefix
from runwire.infra.auth import tenant_user
from tests.secured import Broker
from tests.services import InProcessStack, collect

pytestmark = [pytest.mark.integration, pytest.mark.security]


async def test_a_consumer_delivering_into_another_tenants_run_changes_nothing_it_sees(
    broker: Broker, secured: InProcessStack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="runwire.client")
    s = broker.subjects
    acme = await broker.tenant("acme")
    globex = await broker.tenant("globex")
    attacker, _ = await broker.connect(tenant_user("acme"), inbox=inbox_prefix("acme"))
    try:
        # The attacker's own run, whose frames it will replay into the victim's run.
        own = await acme.submit({"tokens": ["injected ", "text"]})
        await collect(acme, own.run.run_id)

        tokens = [f"t{i} " for i in range(40)]
        victim = await globex.submit({"tokens": tokens, "token_delay_ms": 20})
        run_id = victim.run.run_id
        started = asyncio.Event()
        seen: list[str] = []

        async def follow() -> None:
            async for frame in globex.stream(run_id):
                seen.append(frame.type)
                if frame.type == FrameType.MESSAGE:
                    started.set()

        following = asyncio.create_task(follow())
        await asyncio.wait_for(started.wait(), 20)  # the victim's client follows live
        await attacker.jetstream(timeout=5).add_consumer(
            s.events_stream,
            ConsumerConfig(
                name="inject",
                filter_subject=s.events("acme", own.run.run_id),
                deliver_subject=s.run_frames("globex", run_id),
                deliver_policy=DeliverPolicy.ALL,
                ack_policy=AckPolicy.NONE,
            ),
        )
        await asyncio.wait_for(following, 30)
        _, rejoined = await collect(globex, run_id)
    finally:
        await attacker.close()
        await acme.close()
        await globex.close()
    # Every frame of the victim's run once, and none of the attacker's.
    assert seen.count(FrameType.DONE) == 1
    assert seen.count(FrameType.MESSAGE) == len(tokens)
    assert rejoined.text == "".join(tokens)
    # The attack did reach the victim's subscription: its messages were skipped.
    assert "skipped" in caplog.text
