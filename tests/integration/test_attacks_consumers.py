"""Attacks through JetStream consumers. A tenant makes consumers only through its own
JetStream API prefix, where the submitter refuses any that reads another tenant's runs,
delivers outside the tenant's inbox, is durable, acknowledged or outlives its client;
the broker refuses it the server's own API. Behind that, for a consumer made otherwise
(an operator's, by mistake, on a tenant's subjects): nats-server refuses only a deliver
subject its own stream stores (a cycle), so a consumer of a tenant's events may deliver
into another tenant's frames subject; a client following a run takes only that run's
frames, wherever messages come from, and recovery removes a tenant's consumer that
breaks the rules, or one more than the tenant may hold."""

import asyncio
import logging

import nats.errors
import nats.js.errors
import pytest
from nats.aio.client import Client as NatsClient
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from runwire.contracts.frames import FrameType, Transcript
from runwire.contracts.identities import OPERATOR, tenant_user
from runwire.contracts.subjects import inbox_prefix
from tests.secured import ON_A_CLUSTER, Broker
from tests.services import InProcessStack, collect, eventually

pytestmark = [pytest.mark.integration, pytest.mark.security, ON_A_CLUSTER]


async def test_a_consumer_delivering_into_another_tenants_run_changes_nothing_it_sees(
    broker: Broker, secured: InProcessStack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="runwire.client")
    caplog.set_level(logging.WARNING, logger="runwire.relay")
    s = broker.subjects
    acme = await broker.tenant("acme")
    globex = await broker.tenant("globex")
    attacker, _ = await broker.connect(tenant_user("acme"), inbox=inbox_prefix("acme"))
    operator, _ = await broker.connect(OPERATOR)
    listener, _ = await broker.connect(tenant_user("globex"), inbox=inbox_prefix("globex"))
    try:
        # The attacker's own run, whose frames it will replay into the victim's run.
        own = await acme.submit({"tokens": ["injected ", "text"]})
        await collect(acme, own.run.run_id)

        # The tenant cannot make a consumer that delivers into another tenant's run: the
        # broker refuses it the server's API, the submitter its own.
        api = attacker.jetstream(prefix=s.jetstream_api("acme"), timeout=15)
        into_theirs = ConsumerConfig(
            filter_subject=s.run_frames("acme", own.run.run_id),
            deliver_subject=s.live_frames("globex", own.run.run_id),
            ack_policy=AckPolicy.NONE,
        )
        with pytest.raises((nats.errors.TimeoutError, nats.js.errors.Error)):
            await attacker.jetstream(timeout=2).add_consumer(s.run_frames_stream, into_theirs)
        with pytest.raises(nats.js.errors.APIError) as refused:
            await api.add_consumer(s.run_frames_stream, into_theirs)
        assert "delivers into the tenant's inbox only" in str(refused.value)

        tokens = [f"t{i} " for i in range(40)]
        victim = await globex.submit({"tokens": tokens, "token_delay_ms": 60})
        run_id = victim.run.run_id
        started = asyncio.Event()
        seen: list[str] = []
        live = Transcript()

        async def follow() -> None:
            async for frame in globex.stream(run_id):
                seen.append(frame.type)
                live.apply(frame)
                if frame.type == FrameType.MESSAGE:
                    started.set()

        following = asyncio.create_task(follow())
        await asyncio.wait_for(started.wait(), 20)  # the victim's client follows live
        # What it could not make, made by an operator's mistake (a consumer of no one
        # tenant's, which recovery leaves alone): the attacker's run's events into the
        # victim's frames subject, and its stored frames into the victim's live subject,
        # where the stream republishes what it stores (followers and the archiver
        # listen there).
        injections = {
            "inject": (s.events_stream, s.events("*", own.run.run_id), s.run_frames),
            "inject-live": (
                s.run_frames_stream,
                s.run_frames("*", own.run.run_id),
                s.live_frames,
            ),
        }
        # A client of the victim's listening on each subject (the SDK's follow may read
        # through a consumer of its own instead): the injections are delivered.
        for _, _, victims in injections.values():
            await listener.subscribe(victims("globex", run_id))
        await listener.flush()
        for name, (stream, own_subject, victims) in injections.items():
            config = ConsumerConfig(
                name=name,
                filter_subject=own_subject,
                deliver_subject=victims("globex", run_id),
                deliver_policy=DeliverPolicy.ALL,
                ack_policy=AckPolicy.NONE,
            )
            await operator.jetstream(timeout=15).add_consumer(stream, config)
        await asyncio.wait_for(following, 30)
        _, rejoined = await collect(globex, run_id)
    finally:
        await listener.close()
        await operator.close()
        await attacker.close()
        await acme.close()
        await globex.close()
    # Every frame of the victim's run once, and none of the attacker's: live, and as
    # archived (the archiver left out what the stream did not store).
    assert "that the frames stream did not store: left out" in caplog.text
    assert seen.count(FrameType.DONE) == 1
    assert live.text == "".join(tokens)
    assert rejoined.text == "".join(tokens)


async def _alive(nc: NatsClient, stream: str, name: str) -> bool:
    try:
        await nc.jetstream(timeout=5).consumer_info(stream, name)
    except nats.js.errors.NotFoundError:
        return False
    except nats.errors.TimeoutError as exc:
        # On a busy cluster a consumer being removed can leave the info request
        # unanswered for a while: not an answer either way, ask again.
        raise AssertionError(f"no answer about consumer {name} yet") from exc
    return True


async def test_a_tenants_consumers_that_break_the_rules_are_removed(
    broker: Broker, db_url: str, prefix: str
) -> None:
    s = broker.subjects
    mine = f"{inbox_prefix('acme')}.mine"
    # What neither the broker nor the submitter let a tenant make, made on its subjects
    # by an operator's mistake: recovery removes each.
    broken = {
        "durable": ConsumerConfig(name="keep", durable_name="keep", ack_policy=AckPolicy.NONE),
        "forever": ConsumerConfig(name="forever", inactive_threshold=86_400.0),
        "elsewhere": ConsumerConfig(name="elsewhere", deliver_subject=s.command("acme", "submit")),
        "redelivered": ConsumerConfig(
            name="redelivered",
            deliver_subject=mine,
            ack_policy=AckPolicy.EXPLICIT,
            max_deliver=-1,
            ack_wait=1.0,
        ),
    }
    overrides = {
        "tenant_max_consumers": 3,
        "consumer_sweep_ms": 200,
        "stream_replicas": broker.replicas,
    }
    async with InProcessStack(
        broker.services_url, db_url, prefix, identities=broker.identities, overrides=overrides
    ):
        acme = await broker.tenant("acme")
        attacker, _ = await broker.connect(tenant_user("acme"), inbox=inbox_prefix("acme"))
        operator, _ = await broker.connect(OPERATOR)
        try:
            done = await acme.submit({"tokens": ["a ", "b"]})
            await collect(acme, done.run.run_id)
            names = []
            for config in broken.values():
                config.filter_subject = s.events("acme", done.run.run_id)
                config.deliver_policy = DeliverPolicy.ALL
                made = await operator.jetstream(timeout=15).add_consumer(s.events_stream, config)
                names.append(made.name)
            js = attacker.jetstream(prefix=s.jetstream_api("acme"), timeout=15)
            for name in names:
                await eventually(lambda n=name: _gone(operator, s.events_stream, n), timeout=30)

            # Keeping the rules, a tenant may hold three it reads; the fourth and fifth go.
            frames = s.run_frames_stream
            kept = []
            reading = []
            for i in range(6):
                if i == 5:
                    # The first one's client stops reading: it makes room for a sixth.
                    await reading[0].unsubscribe()
                    await attacker.flush()
                reading.append(await attacker.subscribe(f"{mine}.{i}"))
                info = await js.add_consumer(
                    frames,
                    ConsumerConfig(
                        name=f"ok-{i}",
                        filter_subject=s.run_frames("acme", done.run.run_id),
                        deliver_subject=f"{mine}.{i}",
                        ack_policy=AckPolicy.NONE,
                        inactive_threshold=60.0,
                    ),
                )
                kept.append(info.name)
                if i == 4:
                    await eventually(
                        lambda: _left(operator, frames, kept, [1, 1, 1, 0, 0]), timeout=30
                    )

            await eventually(lambda: _left(operator, frames, kept, [0, 1, 1, 0, 0, 1]), timeout=30)
        finally:
            await operator.close()
            await attacker.close()
            await acme.close()


async def _left(nc: NatsClient, stream: str, names: list[str], alive: list[int]) -> bool:
    """Whether the consumers `names` of `stream` are alive (1) or gone (0) as `alive` says."""
    return [int(await _alive(nc, stream, name)) for name in names] == alive


async def _gone(nc: NatsClient, stream: str, name: str) -> bool:
    return not await _alive(nc, stream, name)
