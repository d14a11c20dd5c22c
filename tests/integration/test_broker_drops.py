"""A subscription that falls behind: the client drops what comes past its bounds, and
says so once in a while with a count, not once per message (the relay's archive hears
every frame on one subscription; a burst past its bounds must not flood the log)."""

import asyncio
import logging
import uuid

import pytest

from runwire.contracts.subjects import Subjects
from runwire.runtime.broker import Broker
from runwire.testing.servers import Servers
from runwire.testing.waiting import eventually

pytestmark = pytest.mark.integration


async def test_messages_dropped_for_a_slow_subscription_are_said_once_with_a_count(
    infra: Servers, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="runwire.runtime.broker")
    broker = await Broker.connect(infra.nats_url, Subjects(prefix), name="test-slow")
    subject = f"{prefix}.test.{uuid.uuid4().hex}"
    held = asyncio.Event()
    taken: list[bytes] = []

    async def slow(msg: object) -> None:
        taken.append(getattr(msg, "data", b""))
        await held.wait()

    try:
        await broker.nc.subscribe(subject, cb=slow, pending_msgs_limit=10)
        for i in range(500):
            await broker.nc.publish(subject, str(i).encode())
        await broker.nc.flush()

        async def dropped() -> list[logging.LogRecord]:
            return [r for r in caplog.records if "dropped for a subscription" in r.getMessage()]

        await eventually(dropped, timeout=10)
        await eventually(lambda: taken, timeout=10)
        held.set()
    finally:
        await broker.close()
    said = await dropped()
    assert len(said) == 1, [r.getMessage() for r in caplog.records]
    assert "since last said" in said[0].getMessage()
    assert not [r for r in caplog.records if "NATS connection error" in r.getMessage()]
