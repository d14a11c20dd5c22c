"""Attacks through the reply subject: a request's reply subject is the requester's
choice, and a service that answered wherever it pointed would publish for the
requester: jobs into the queue, frames and events of another tenant's runs, cancel
notices, replies into another tenant's inbox. A command is answered only under the
tenant's own inbox prefix (or NATS's default); anything else is not served at all. And an
executor believes a cancel notice only once Postgres says the run's cancel was
requested."""

import json
import logging
import uuid
from typing import Any

import pytest
from nats.aio.msg import Msg

from runwire.contracts.frames import FrameType
from runwire.contracts.identities import OPERATOR, tenant_user
from runwire.contracts.status import RunStatus
from runwire.contracts.subjects import inbox_prefix
from runwire.runtime.metrics import COMMANDS_REFUSED
from tests.secured import ON_A_CLUSTER, Broker
from tests.services import InProcessStack, collect, eventually

pytestmark = [pytest.mark.integration, pytest.mark.security, ON_A_CLUSTER]

TOKENS = ["tok "] * 30


def refused() -> float:
    """Commands this process's services refused for their reply subject, so far."""
    return sum(
        sample.value
        for metric in COMMANDS_REFUSED.collect()
        for sample in metric.samples
        if sample.name.endswith("_total")
    )


def body(**fields: Any) -> bytes:
    return json.dumps({"v": 1, **fields}).encode()


async def test_a_tenant_cannot_point_a_services_reply_at_jobs_frames_events_or_inboxes(
    broker: Broker, secured: InProcessStack
) -> None:
    s = broker.subjects
    globex = await broker.tenant("globex")
    victim = await globex.submit({"tokens": TOKENS, "token_delay_ms": 20}, session_id="chat")
    run_id = victim.run.run_id

    # What each forged reply would have written: a job nobody submitted (or, repeated,
    # a full queue: QUEUE_FULL for every tenant), frames and events in another tenant's
    # run, a cancel notice for its run, a reply in its inbox.
    forged_job = s.job("scripted", str(uuid.uuid4()))
    attacks = {
        "submit": (body(request_id="attack-1", input={"tokens": ["x"]}), forged_job),
        "get": (body(run_id=run_id), s.run_frames("globex", run_id)),
        "join": (body(run_id=run_id), s.events("globex", run_id)),
        "cancel": (body(run_id=str(uuid.uuid4())), s.cancel_notice(run_id)),
        "abort_session": (body(session_id="x"), f"{inbox_prefix('globex')}.stolen"),
    }
    landed: list[Msg] = []

    async def seen(msg: Msg) -> None:
        # The victim's own frames and events go there too: a reply is what has `ok`.
        if "ok" in json.loads(msg.data or b"{}"):
            landed.append(msg)

    watcher, _ = await broker.connect(OPERATOR)  # the operator may watch every subject
    attacker, _ = await broker.connect(tenant_user("acme"), inbox=inbox_prefix("acme"))
    acme = await broker.tenant("acme")
    try:
        for _, target in attacks.values():
            await watcher.subscribe(target, cb=seen)
        await watcher.flush()
        before = refused()
        for name, (payload, target) in attacks.items():
            # The tenant's own command subject, which the broker lets it use.
            await attacker.publish(s.command("acme", name), payload, reply=target)
        await attacker.flush()
        await eventually(lambda: refused() - before >= len(attacks))

        # The victim's run was not canceled and its stream holds only its own frames.
        _, transcript = await collect(globex, run_id)
        ended = await globex.get(run_id)
        # The refused submit created nothing: the same request id is new.
        again = await acme.submit({"tokens": ["mine"]}, request_id="attack-1")
        await watcher.flush()
    finally:
        await acme.close()
        await globex.close()
        await attacker.close()
        await watcher.close()
    assert landed == []
    assert transcript.text == "".join(TOKENS)
    assert ended.status == RunStatus.FINISHED
    assert again.duplicate is False
    secured.check_alive()


async def test_a_health_reply_goes_only_to_an_inbox(
    broker: Broker, secured: InProcessStack, caplog: pytest.LogCaptureFixture
) -> None:
    s = broker.subjects
    target = s.job("scripted", str(uuid.uuid4()))
    landed: list[Msg] = []

    async def seen(msg: Msg) -> None:
        landed.append(msg)

    watcher, _ = await broker.connect(OPERATOR)
    attacker, _ = await broker.connect(tenant_user("acme"), inbox=inbox_prefix("acme"))
    try:
        await watcher.subscribe(target, cb=seen)
        await watcher.flush()
        with caplog.at_level(logging.WARNING):
            await attacker.publish(s.health("submitter"), b"", reply=target)
            await attacker.flush()
            await eventually(lambda: "outside any inbox: not answered" in caplog.text)
        # Asked properly, it answers.
        answer = await attacker.request(s.health("submitter"), b"", timeout=5)
        await watcher.flush()
    finally:
        await attacker.close()
        await watcher.close()
    assert landed == []
    assert json.loads(answer.data)["service"] == "submitter"


async def test_a_cancel_notice_alone_cancels_nothing(
    stack: InProcessStack, caplog: pytest.LogCaptureFixture
) -> None:
    # On a broker that enforces nothing anyone can publish a cancel notice: the executor
    # aborts an attempt only when Postgres says its cancel was requested.
    client = stack.client
    reply = await client.submit({"tokens": TOKENS, "token_delay_ms": 20})
    run_id = reply.run.run_id
    text = ""
    with caplog.at_level(logging.WARNING):
        async for frame in client.stream(run_id):
            if frame.type == FrameType.MESSAGE and not text:  # its attempt runs
                await client.nc.publish(client.subjects.cancel_notice(run_id), b"")
                await eventually(lambda: "whose cancel was not requested: ignored" in caplog.text)
            if frame.type == FrameType.MESSAGE:
                text += str(frame.data["text"])
    assert text == "".join(TOKENS)
    assert (await client.get(run_id)).status == RunStatus.FINISHED
    # A cancel the submitter records is still obeyed.
    second = await client.submit({"tokens": TOKENS, "token_delay_ms": 50})
    async for frame in client.stream(second.run.run_id):
        if frame.type == FrameType.MESSAGE:
            await client.cancel(second.run.run_id)
            break
    await collect(client, second.run.run_id)
    assert (await client.get(second.run.run_id)).status == RunStatus.CANCELED
