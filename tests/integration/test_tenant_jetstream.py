"""A tenant follows its runs with the official NATS clients' own idioms: an ordered
consumer of nats-py (here) and of nats.js (`follow_ordered.mjs`), through the tenant's
JetStream API prefix (`<prefix>.<tenant>.JS.API`), on a broker that enforces identities.
Each yields a run's frames (or events) once, in order, from the start or from the
stream sequence a join names; the same calls on another tenant's run are refused, and
what the API shows a tenant of the shared streams names no other tenant."""

import asyncio
import json
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import nats.js.errors
import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.subscription import Subscription
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from runwire.contracts.events import RunEvent
from runwire.contracts.frames import Frame, FrameType
from runwire.contracts.identities import tenant_user
from runwire.contracts.subjects import inbox_prefix
from tests.nodejs import NODE_DIR, install_node_modules
from tests.secured import ON_A_CLUSTER, Broker
from tests.services import InProcessStack, collect, eventually

pytestmark = [pytest.mark.integration, pytest.mark.security, ON_A_CLUSTER]

TOKENS = [f"t{i} " for i in range(24)]
ROOT = Path(__file__).resolve().parents[2]


async def _tenant_connection(broker: Broker, tenant: str) -> NatsClient:
    nc, _ = await broker.connect(tenant_user(tenant), inbox=inbox_prefix(tenant))
    return nc


async def _frames(sub: Subscription, *, until_done: bool = True) -> list[Frame]:
    frames: list[Frame] = []
    while True:
        msg = await sub.next_msg(timeout=20)
        frame = Frame.model_validate_json(msg.data)
        frames.append(frame)
        if until_done and frame.type == FrameType.DONE:
            return frames


def _text(frames: list[Frame]) -> str:
    return "".join(f.data["text"] for f in frames if f.type == FrameType.MESSAGE)


async def test_an_ordered_consumer_follows_a_run_from_its_start_and_from_a_join(
    broker: Broker, secured: InProcessStack
) -> None:
    s = broker.subjects
    acme = await broker.tenant("acme")
    nc = await _tenant_connection(broker, "acme")
    try:
        js = nc.jetstream(prefix=s.jetstream_api("acme"), timeout=15)
        sent = await acme.submit({"tokens": TOKENS, "token_delay_ms": 40})
        run_id = sent.run.run_id
        subject = s.run_frames("acme", run_id)

        # From the start: the stream is found by the run's subject, as the client does.
        from_start = await js.subscribe(subject, ordered_consumer=True)
        seen = await _frames(from_start)
        assert [f.seq for f in seen] == list(range(1, len(seen) + 1))
        assert _text(seen) == "".join(TOKENS)

        # From where a join's replay stops, while a second run goes on.
        second = await acme.submit({"tokens": TOKENS, "token_delay_ms": 40})
        second_subject = s.run_frames("acme", second.run.run_id)
        joined = None
        while joined is None or not joined.replay:
            joined = await acme.join(second.run.run_id)
        assert joined.live is not None, "the run ended before it was joined"
        after_join = await js.subscribe(
            second_subject,
            ordered_consumer=True,
            config=ConsumerConfig(
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                opt_start_seq=joined.live.stream_seq,
            ),
        )
        rest = await _frames(after_join)
        seqs = [f.seq for f in joined.replay] + [f.seq for f in rest]
        assert seqs == list(range(1, len(seqs) + 1))
        assert _text(joined.replay + rest) == "".join(TOKENS)
    finally:
        await nc.close()


async def test_an_ordered_consumer_follows_a_runs_events(
    broker: Broker, secured: InProcessStack
) -> None:
    s = broker.subjects
    acme = await broker.tenant("acme")
    nc = await _tenant_connection(broker, "acme")
    try:
        sent = await acme.submit({"tokens": ["a", "b"]})
        await collect(acme, sent.run.run_id)
        js = nc.jetstream(prefix=s.jetstream_api("acme"), timeout=15)
        sub = await js.subscribe(s.events("acme", sent.run.run_id), ordered_consumer=True)
        events: list[RunEvent] = []
        while not events or events[-1].event != "finished":
            events.append(RunEvent.model_validate_json((await sub.next_msg(timeout=20)).data))
        assert [e.event for e in events] == ["submitted", "claimed", "finished"]
        assert {e.run_id for e in events} == {sent.run.run_id}
    finally:
        await nc.close()


async def test_another_tenants_run_is_refused_and_the_streams_show_no_other_tenant(
    broker: Broker, secured: InProcessStack
) -> None:
    s = broker.subjects
    globex = await broker.tenant("globex")
    victim = await globex.submit({"tokens": ["secret ", "text"]})
    await collect(globex, victim.run.run_id)
    nc = await _tenant_connection(broker, "acme")
    try:
        js = nc.jetstream(prefix=s.jetstream_api("acme"), timeout=15)
        theirs = s.run_frames("globex", victim.run.run_id)
        # No stream of the tenant's holds that subject, and naming the stream is refused.
        with pytest.raises(nats.js.errors.NotFoundError):
            await js.subscribe(theirs, ordered_consumer=True)
        with pytest.raises(nats.js.errors.APIError) as refused:
            await js.subscribe(theirs, stream=s.run_frames_stream, ordered_consumer=True)
        assert refused.value.code == 403

        # What the tenant learns of the shared streams: its own subjects, no counts.
        for stream in (s.run_frames_stream, s.events_stream):
            answer = await nc.request(
                f"{s.jetstream_api('acme')}.STREAM.INFO.{stream}",
                json.dumps({"subjects_filter": ">"}).encode(),
                timeout=15,
            )
            shown = json.loads(answer.data)
            assert "globex" not in answer.data.decode()
            assert victim.run.run_id not in answer.data.decode()
            assert all(".acme." in subject for subject in shown["config"]["subjects"])
            assert shown["state"]["messages"] == 0
        names = await nc.request(f"{s.jetstream_api('acme')}.STREAM.NAMES", b"{}", timeout=15)
        assert sorted(json.loads(names.data)["streams"]) == sorted(
            [s.run_frames_stream, s.events_stream]
        )
        # The account's information (what a client asks to see JetStream is there): the
        # two streams, and no usage of the account every tenant shares.
        account = await js.account_info()
        assert (account.streams, account.consumers, account.storage) == (2, 0, 0)
    finally:
        await nc.close()


async def _refusal(js: Any, stream: str, config: ConsumerConfig) -> int:
    with pytest.raises(nats.js.errors.APIError) as refused:
        await js.add_consumer(stream, config)
    return int(refused.value.code)


async def test_consumers_a_tenant_may_not_make_are_refused_before_the_server_sees_them(
    broker: Broker, secured: InProcessStack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="runwire.submitter")
    s = broker.subjects
    acme = await broker.tenant("acme")
    own = await acme.submit({"tokens": ["x"]})
    await collect(acme, own.run.run_id)
    mine = s.run_frames("acme", own.run.run_id)
    nc = await _tenant_connection(broker, "acme")
    globex_nc = await _tenant_connection(broker, "globex")
    try:
        js = nc.jetstream(prefix=s.jetstream_api("acme"), timeout=15)
        inbox = nc.new_inbox()
        wrong = {
            "durable": ConsumerConfig(durable_name="keep", filter_subject=mine),
            "another tenant's runs": ConsumerConfig(
                filter_subject=s.run_frames("globex", "*"), deliver_subject=inbox
            ),
            "every tenant": ConsumerConfig(filter_subject=s.run_frames_wildcard),
            "no filter": ConsumerConfig(deliver_subject=inbox),
            "delivers elsewhere": ConsumerConfig(
                filter_subject=mine, deliver_subject=s.run_frames("globex", "x")
            ),
            "acknowledged": ConsumerConfig(
                filter_subject=mine, deliver_subject=inbox, ack_policy=AckPolicy.EXPLICIT
            ),
            "outlives its client": ConsumerConfig(
                filter_subject=mine, deliver_subject=inbox, inactive_threshold=86_400
            ),
        }
        for why, config in wrong.items():
            assert await _refusal(js, s.run_frames_stream, config) == 403, why
        with pytest.raises(nats.js.errors.APIError):
            await js.delete_stream(s.run_frames_stream)
        assert await broker.consumers_of("acme") == 0

        # A consumer of another tenant's is not found by this one's name for it.
        gjs = globex_nc.jetstream(prefix=s.jetstream_api("globex"), timeout=15)
        theirs = await gjs.add_consumer(
            s.run_frames_stream,
            ConsumerConfig(
                name="globex-reads",
                filter_subject=s.run_frames("globex", "*"),
                deliver_policy=DeliverPolicy.ALL,
                ack_policy=AckPolicy.NONE,
            ),
        )
        with pytest.raises(nats.js.errors.NotFoundError):
            await js.consumer_info(s.run_frames_stream, theirs.name)
        with pytest.raises(nats.js.errors.NotFoundError):
            await js.delete_consumer(s.run_frames_stream, theirs.name)
        # Nor made anew under its name with this tenant's filter.
        taken = ConsumerConfig(name=theirs.name, filter_subject=mine, ack_policy=AckPolicy.NONE)
        assert await _refusal(js, s.run_frames_stream, taken) == 400
        assert (
            await gjs.consumer_info(s.run_frames_stream, theirs.name)
        ).config.filter_subject == (s.run_frames("globex", "*"))

        # A request whose answer would go outside the tenant's inbox is not served.
        await nc.publish(
            f"{s.jetstream_api('acme')}.STREAM.NAMES",
            b"{}",
            reply=f"{inbox_prefix('globex')}.stolen",
        )
        await eventually(lambda: "reply subject is outside" in caplog.text, timeout=15)
    finally:
        await nc.close()
        await globex_nc.close()


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
async def test_a_javascript_ordered_consumer_follows_a_run_and_its_events(
    broker: Broker, secured: InProcessStack
) -> None:
    s = broker.subjects
    acme = await broker.tenant("acme")
    sent = await acme.submit({"tokens": TOKENS, "token_delay_ms": 40})
    run_id = sent.run.run_id
    joined = None
    while joined is None or not joined.replay:
        joined = await acme.join(run_id)
    assert joined.live is not None, "the run ended before it was joined"
    user = tenant_user("acme")
    await asyncio.to_thread(install_node_modules)

    async def node(
        subject: str, start: int, *mode: str, stream: str = s.run_frames_stream
    ) -> dict[str, Any]:
        script = await asyncio.create_subprocess_exec(
            "node",
            "follow_ordered.mjs",
            broker.url,
            user,
            broker.identities.passwords[user],
            inbox_prefix("acme"),
            s.jetstream_api("acme"),
            stream,
            subject,
            str(start),
            *mode,
            cwd=NODE_DIR,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        # Up to 75 s in the script: the client's own recovery of a dropped pull (see
        # follow_ordered.mjs), and the node process's start beside it.
        out, err = await asyncio.wait_for(script.communicate(), 100)
        assert script.returncode == 0, err.decode()
        seen: dict[str, Any] = json.loads(out)
        return seen

    mine = s.run_frames("acme", run_id)
    from_start, after_join = await asyncio.gather(node(mine, 1), node(mine, joined.live.stream_seq))
    assert from_start["seqs"] == list(range(1, len(from_start["seqs"]) + 1)), from_start
    assert from_start["text"] == "".join(TOKENS), from_start
    seqs = [f.seq for f in joined.replay] + after_join["seqs"]
    assert seqs == list(range(1, len(seqs) + 1)), after_join
    assert _text(joined.replay) + after_join["text"] == "".join(TOKENS), after_join

    # And the run's events, from the events stream's start.
    events = await node(s.events("acme", run_id), 1, stream=s.events_stream)
    assert events["events"] == ["submitted", "claimed", "finished"], events

    # The same client's consumer of another tenant's run: refused.
    globex = await broker.tenant("globex")
    victim = await globex.submit({"tokens": ["secret"]})
    refused = await node(s.run_frames("globex", victim.run.run_id), 1, "add")
    assert refused["made"] is False
    assert "not a subject of the tenant's runs" in refused["error"]
    assert (await node(mine, 1, "add"))["made"] is True


def _example_env(broker: Broker) -> dict[str, str]:
    """The environment an example runs in: tenant acme's settings, nothing else of ours."""
    user = tenant_user("acme")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNWIRE_")}
    return env | {
        "RUNWIRE_NATS_URL": broker.url,
        "RUNWIRE_PREFIX": broker.subjects.prefix,
        "RUNWIRE_TENANT": "acme",
        "RUNWIRE_NATS_USER": user,
        "RUNWIRE_NATS_PASSWORD": broker.identities.passwords[user],
    }


async def _example(
    command: list[str], env: dict[str, str], *, script: bytes = b"", cwd: Path | None = None
) -> str:
    """Run an example (`script`: given on standard input); what it printed."""
    proc = await asyncio.create_subprocess_exec(
        *command,
        env=env,
        cwd=cwd,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(script), 60)
    assert proc.returncode == 0, err.decode()
    return out.decode().strip()


async def test_the_python_example_follows_a_run_with_nats_py_alone(
    broker: Broker, secured: InProcessStack
) -> None:
    example = str(ROOT / "examples" / "follow_with_nats.py")
    printed = await _example([sys.executable, example], _example_env(broker))
    assert printed == "'Hi there' finished"


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
async def test_the_javascript_example_follows_a_run_with_nats_js_alone(
    broker: Broker, secured: InProcessStack
) -> None:
    await asyncio.to_thread(install_node_modules)
    # Run where the `nats` package is installed (an ES module on standard input resolves
    # its imports from the working folder).
    script = (ROOT / "examples" / "follow_with_nats.mjs").read_bytes()
    printed = await _example(
        ["node", "--input-type=module"], _example_env(broker), script=script, cwd=NODE_DIR
    )
    assert printed == '"Hi there" finished'
