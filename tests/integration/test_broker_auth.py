"""Identities the broker enforces (infra/auth.py), on a nats-server with authentication:
the services work as their own identities, and tenants, outsiders and a stolen service
identity are refused by the broker itself, not only by runwire's services."""

import asyncio
import os
import sys
from pathlib import Path

import nats
import nats.errors
import nats.js.errors
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from runwire import ClientError
from runwire.client import Client
from runwire.contracts.errors import ErrorCode
from runwire.contracts.identities import service_user, tenant_user
from runwire.contracts.status import RunStatus
from runwire.contracts.subjects import inbox_prefix, service_inbox
from tests.secured import ON_A_CLUSTER, Broker
from tests.services import InProcessStack, collect, eventually

pytestmark = [pytest.mark.integration, ON_A_CLUSTER]

ROOT = Path(__file__).resolve().parents[2]


async def test_the_services_run_a_run_as_their_own_identities(
    broker: Broker, secured: InProcessStack
) -> None:
    acme = await broker.tenant("acme")
    try:
        reply = await acme.submit({"tokens": ["only", " mine"]})
        _, transcript = await collect(acme, reply.run.run_id)
        run = await acme.get(reply.run.run_id)
        canceled = await acme.submit({"tokens": ["x"] * 200, "token_delay_ms": 20})
        await acme.cancel(canceled.run.run_id)
        _, _ = await collect(acme, canceled.run.run_id)
        gone = await acme.get(canceled.run.run_id)
    finally:
        await acme.close()
    assert transcript.text == "only mine"
    assert run.status == RunStatus.FINISHED
    assert gone.status == RunStatus.CANCELED
    secured.check_alive()


async def test_a_tenant_cannot_reach_another_tenants_runs(
    broker: Broker, secured: InProcessStack
) -> None:
    globex = await broker.tenant("globex")
    theirs = await globex.submit({"tokens": ["secret"]})
    await collect(globex, theirs.run.run_id)
    run_id = theirs.run.run_id
    s = broker.subjects

    # Commands of another tenant's subject: refused by the broker (UNAUTHORIZED), for
    # read, join, cancel and abort alike.
    impostor = await broker.tenant("acme")
    impostor.tenant = "globex"  # a client that names another tenant
    refusals = []
    for call in (
        impostor.get(run_id),
        impostor.join(run_id),
        impostor.cancel(run_id),
        impostor.abort_session("s"),
    ):
        with pytest.raises(ClientError) as refused:
            await call
        refusals.append((refused.value.code, refused.value.retryable))
    await impostor.close()
    assert refusals == [(ErrorCode.UNAUTHORIZED, False)] * 4

    # Raw: subscriptions to another tenant's frames, events or replies, and a consumer on
    # its frames.
    nc, errors = await broker.connect(tenant_user("acme"), inbox=inbox_prefix("acme"))
    try:
        for subject in (
            s.run_frames("globex", run_id),
            s.events("globex", run_id),
            f"{inbox_prefix('globex')}.>",
            "_INBOX.>",
            # To answer another tenant's commands with forged replies.
            s.command("globex", "get"),
            s.command("*", "submit"),
        ):
            await nc.subscribe(subject)
        await nc.flush()
        await eventually(lambda: sum("subscription" in e.lower() for e in errors) >= 6)
        # JetStream's own API: refused by the broker, even on its own runs (the server
        # takes a consumer's filter and deliver subject from the body, which the broker
        # does not read); the tenant's JetStream API prefix, which the submitter checks,
        # makes its own runs' consumer and refuses another tenant's.
        own = ConsumerConfig(
            filter_subject=s.run_frames("acme", "*"),
            deliver_policy=DeliverPolicy.ALL,
            deliver_subject=f"{inbox_prefix('acme')}.mine",
            ack_policy=AckPolicy.NONE,
        )
        theirs = ConsumerConfig(
            filter_subject=s.run_frames("globex", run_id),
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.NONE,
        )
        for config in (own, theirs):
            with pytest.raises((nats.errors.TimeoutError, nats.js.errors.Error, TimeoutError)):
                await nc.jetstream(timeout=2).add_consumer(s.run_frames_stream, config)
        api = nc.jetstream(prefix=s.jetstream_api("acme"), timeout=5)
        with pytest.raises(nats.js.errors.APIError):
            await api.add_consumer(s.run_frames_stream, theirs)
        mine = await api.add_consumer(s.run_frames_stream, own)
        assert mine.config.filter_subject == s.run_frames("acme", "*")
        # The last stored frame of a run (how a client learns whether a run it just
        # submitted has frames yet): of its own runs only, through the server's API or
        # the tenant's.
        for api in ("$JS.API", s.jetstream_api("acme")):
            direct = f"{api}.DIRECT.GET.{s.run_frames_stream}"
            theirs_last = f"{direct}.{s.run_frames('globex', run_id)}"
            if api == "$JS.API":
                with pytest.raises((nats.errors.TimeoutError, TimeoutError)):
                    await nc.request(theirs_last, b"", timeout=1)
            else:
                refused = await nc.request(theirs_last, b"", timeout=5)
                assert b"not a subject of the tenant's runs" in refused.data
            none_yet = await nc.request(f"{direct}.{s.run_frames('acme', run_id)}", b"", timeout=5)
            assert (none_yet.headers or {}).get("Status") == "404"
    finally:
        await nc.close()
    await globex.close()


async def test_a_tenant_cannot_manage_streams_publish_jobs_or_control_runs(
    broker: Broker, secured: InProcessStack
) -> None:
    s = broker.subjects
    nc, errors = await broker.connect(tenant_user("acme"), inbox=inbox_prefix("acme"))
    try:
        for subject in (
            s.job("scripted", "00000000-0000-0000-0000-000000000000"),
            s.cancel_notice("00000000-0000-0000-0000-000000000000"),
            s.frames_out("acme", "00000000-0000-0000-0000-000000000000"),
            s.run_frames("acme", "00000000-0000-0000-0000-000000000000"),
            s.events("acme", "00000000-0000-0000-0000-000000000000"),
            f"$JS.API.STREAM.DELETE.{s.run_frames_stream}",
            f"$JS.API.STREAM.PURGE.{s.jobs_stream}",
            "$JS.API.STREAM.CREATE.MINE",
            s.command("acme", "set_budget"),
            s.command("acme", "set_policy"),
            # Rate limits are every tenant's: an operator's.
            s.command("acme", "set_rate_limit"),
            s.command("acme", "get_rate_limits"),
        ):
            await nc.publish(subject, b"{}")
        await nc.flush()
        await eventually(lambda: sum("publish" in e.lower() for e in errors) >= 12)
    finally:
        await nc.close()
    service, _ = await broker.connect(service_user("recovery"), inbox=service_inbox("recovery"))
    try:
        info = await service.jetstream().stream_info(s.run_frames_stream)
    finally:
        await service.close()
    assert info.config.name == s.run_frames_stream  # still there


async def test_outsiders_and_stolen_service_identities_are_refused(
    broker: Broker, secured: InProcessStack
) -> None:
    with pytest.raises(ClientError) as nobody:
        await Client.connect(broker.url, tenant="acme", prefix=broker.subjects.prefix)
    with pytest.raises(ClientError) as wrong:
        await Client.connect(
            broker.url,
            tenant="acme",
            prefix=broker.subjects.prefix,
            user=tenant_user("acme"),
            password="guessed",
        )
    assert (nobody.value.code, wrong.value.code) == (ErrorCode.UNAUTHORIZED,) * 2

    # An executor's identity publishes frames (to the frames stream) and jobs, never on a
    # run's client subject directly, nor cancel notices; it cannot delete or purge a
    # stream, or make one of its own.
    s = broker.subjects
    nc, errors = await broker.connect(service_user("executor"), inbox=service_inbox("executor"))
    try:
        await nc.publish(s.run_frames("acme", "00000000-0000-0000-0000-000000000000"), b"{}")
        await nc.publish(s.cancel_notice("00000000-0000-0000-0000-000000000000"), b"")
        await nc.publish(s.command("acme", "submit"), b"{}")
        await nc.publish(f"$JS.API.STREAM.DELETE.{s.run_frames_stream}", b"")
        await nc.publish(f"$JS.API.STREAM.PURGE.{s.jobs_stream}", b"")
        # A stream of its own (one that would store a tenant's inbox, say).
        await nc.publish("$JS.API.STREAM.CREATE.SNOOP", b"")
        await nc.flush()
        await eventually(lambda: sum("publish" in e.lower() for e in errors) >= 6)
    finally:
        await nc.close()
    # Recovery purges ended runs' client frames and jobs nobody takes, and nothing else.
    nc, errors = await broker.connect(service_user("recovery"), inbox=service_inbox("recovery"))
    try:
        await nc.publish(f"$JS.API.STREAM.PURGE.{s.frames_in_stream}", b"")
        await nc.publish(f"$JS.API.STREAM.PURGE.{s.events_stream}", b"")
        await nc.publish(f"$JS.API.STREAM.DELETE.{s.jobs_stream}", b"")
        await nc.flush()
        await eventually(lambda: sum("publish" in e.lower() for e in errors) >= 3)
        purged = await nc.jetstream().purge_stream(
            s.run_frames_stream,
            subject=s.run_frames("acme", "00000000-0000-0000-0000-000000000000"),
        )
        assert purged is True
    finally:
        await nc.close()


async def test_a_removed_tenant_is_cut_off_at_once(broker: Broker, secured: InProcessStack) -> None:
    acme = await broker.tenant("acme")
    reply = await acme.submit({"tokens": ["before"]})
    await collect(acme, reply.run.run_id)
    password = broker.identities.passwords[tenant_user("acme")]
    broker.identities.remove_tenant("acme")
    broker.write()
    broker.server.reload()
    await eventually(lambda: not acme.nc.is_connected, timeout=10)
    with pytest.raises(ClientError) as after:
        await Client.connect(
            broker.url,
            tenant="acme",
            prefix=broker.subjects.prefix,
            user=tenant_user("acme"),
            password=password,
        )
    await acme.close()
    assert after.value.code == ErrorCode.UNAUTHORIZED
    # Everyone else goes on.
    globex = await broker.tenant("globex")
    reply = await globex.submit({"tokens": ["after"]})
    _, transcript = await collect(globex, reply.run.run_id)
    await globex.close()
    assert transcript.text == "after"


async def test_a_replicas_probe_asks_its_own_service_as_its_identity(
    broker: Broker, secured: InProcessStack, tmp_path: Path
) -> None:
    # What a pod's readiness probe runs: `runwire health executor --local`, with the
    # executor's settings (its identity) and nothing else.
    async def probe(service: str, identity: str) -> tuple[int, str]:
        user = service_user(identity)
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNWIRE_")}
        env |= {
            "PYTHONPATH": str(ROOT),
            "RUNWIRE_NATS_URL": broker.server.url,
            "RUNWIRE_PREFIX": broker.subjects.prefix,
            "RUNWIRE_NATS_USER": user,
            "RUNWIRE_NATS_PASSWORD": broker.identities.passwords[user],
        }
        proc = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "runwire.client.cli", "health", service, "--local"),
            cwd=tmp_path,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode is not None
        return proc.returncode, (out + err).decode()

    for service in ("submitter", "executor", "relay", "recovery"):
        code, said = await probe(service, service)
        assert code == 0, said
        assert " ok " in said
    # Another service's health is not the executor's to ask: nobody answers it.
    code, said = await probe("relay", "executor")
    assert code == 1
    assert "no replica of relay answered" in said
