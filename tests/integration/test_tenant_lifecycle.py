"""A tenant's credentials rotated without a moment refused: its previous password and
API keys keep working until the rotation is finished (the keys at most for the grace
given), then the server closes the connections made with the previous password. A
removed tenant's runs end, and only an operator may end them."""

from collections.abc import Awaitable, Callable
from datetime import timedelta
from functools import partial
from typing import Any

import asyncpg
import nats.errors
import nats.js.errors
import pytest

from runwire import ClientError
from runwire.client import Client
from runwire.contracts.errors import ErrorCode
from runwire.contracts.identities import GATEWAY, OPERATOR, service_user, tenant_user
from runwire.contracts.subjects import GATEWAY_INBOX
from runwire.gateway.keys import ApiKeys
from runwire.infra.auth import (
    API_KEYS_FILE,
    ENV_FILE,
    IDENTITIES_FILE,
    OPERATOR_ENV_FILE,
    add_tenant,
    finish_rotation,
    read_env_file,
    remove_tenant,
    rotate_tenant,
    write_env_file,
)
from runwire.infra.tenants import end_tenant
from tests.secured import ON_A_CLUSTER, Broker
from tests.services import InProcessStack, collect, eventually

pytestmark = [pytest.mark.integration, pytest.mark.security, ON_A_CLUSTER]


async def _connect(broker: Broker, user: str, password: str) -> Client:
    return await Client.connect(
        broker.url,
        tenant="acme",
        prefix=broker.subjects.prefix,
        user=user,
        password=password,
    )


async def _runs(client: Client) -> str:
    reply = await client.submit({"tokens": ["still ", "served"]})
    _, transcript = await collect(client, reply.run.run_id)
    return transcript.text


async def test_a_tenants_credentials_rotate_without_a_moment_refused(
    broker: Broker, secured: InProcessStack
) -> None:
    root = broker.folder
    write_env_file(root / ENV_FILE, {"RUNWIRE_PREFIX": broker.subjects.prefix})
    broker.identities.save(root / IDENTITIES_FILE)
    settings, _ = add_tenant(root, "acme")  # its API key, beside its identity
    old_key = read_env_file(settings)["RUNWIRE_API_KEY"]
    old = (tenant_user("acme"), broker.identities.passwords[tenant_user("acme")])
    keys = ApiKeys(root / API_KEYS_FILE)
    opened: list[Client] = []

    async def connect(user: str, password: str) -> Client:
        client = await _connect(broker, user, password)
        opened.append(client)
        return client

    before = await connect(*old)
    try:
        rotated, told = rotate_tenant(root, "acme", timedelta(hours=1))
        assert told
        new = read_env_file(rotated)
        assert (new["RUNWIRE_NATS_USER"], new["RUNWIRE_NATS_PASSWORD"]) != old
        assert new["RUNWIRE_API_KEY"] != old_key
        # Both passwords and both keys work meanwhile: the connection made before, a
        # new one with the previous password, one with the new.
        assert await _runs(before) == "still served"
        late = await connect(*old)
        fresh = await connect(new["RUNWIRE_NATS_USER"], new["RUNWIRE_NATS_PASSWORD"])
        assert await _runs(late) == await _runs(fresh) == "still served"
        assert keys.tenant_of(old_key) == keys.tenant_of(new["RUNWIRE_API_KEY"]) == "acme"

        had, told = finish_rotation(root, "acme")
        assert had
        assert told
        # The previous password's connections are closed; it is refused from now on.
        await eventually(lambda: not before.nc.is_connected and not late.nc.is_connected)
        with pytest.raises(ClientError) as refused:
            await connect(*old)
        assert refused.value.code == ErrorCode.UNAUTHORIZED
        assert await _runs(fresh) == "still served"
        assert keys.tenant_of(old_key) is None
        assert keys.tenant_of(new["RUNWIRE_API_KEY"]) == "acme"
        # Another rotation (back to the first user, with a new password), whose previous
        # key is accepted for no time at all; one at a time.
        again = read_env_file(rotate_tenant(root, "acme", timedelta(0))[0])
        assert again["RUNWIRE_NATS_USER"] == old[0]
        assert again["RUNWIRE_NATS_PASSWORD"] != old[1]
        with pytest.raises(ValueError, match="not finished"):
            rotate_tenant(root, "acme", timedelta(0))
        assert keys.tenant_of(new["RUNWIRE_API_KEY"]) is None
        assert keys.tenant_of(again["RUNWIRE_API_KEY"]) == "acme"
        assert await _runs(fresh) == "still served"  # the previous user, until finished
    finally:
        for client in opened:
            await client.close()


GREETING = {"nodes": [{"id": "greet", "runner": "scripted", "input": {"tokens": ["hi"]}}]}
OTHER_GREETING = {"nodes": [{"id": "greet", "runner": "scripted", "input": {"tokens": ["yo"]}}]}


async def _as_operator(broker: Broker, tenant: str) -> Client:
    return await Client.connect(
        broker.url,
        tenant=tenant,
        prefix=broker.subjects.prefix,
        user=OPERATOR,
        password=broker.identities.passwords[OPERATOR],
        inbox="_INBOX",
    )


async def _kept_of(broker: Broker, tenant: str) -> dict[str, int]:
    """How many messages of `tenant` each stream it writes to holds."""
    s = broker.subjects
    nc, _ = await broker.connect(OPERATOR)
    try:
        js = nc.jetstream()
        kept = {}
        for stream, subject in (
            (s.run_frames_stream, f"{s.prefix}.{tenant}.runs.>"),
            (s.events_stream, f"{s.prefix}.{tenant}.events.>"),
            (f"KV_{s.threads_bucket}", f"$KV.{s.threads_bucket}.{tenant}.>"),
        ):
            info = await js.stream_info(stream, subjects_filter=subject)
            kept[stream] = sum((info.state.subjects or {}).values())
        return kept
    finally:
        await nc.close()


async def _refusal(request: Callable[[], Awaitable[object]]) -> ErrorCode:
    """The code a request is refused with. A tenant just added may find its first
    requests unanswered (UNAVAILABLE, retryable) while the server gives the services the
    right to answer into its inbox: such a request is asked again."""
    for _ in range(10):
        with pytest.raises(ClientError) as refused:
            await request()
        if refused.value.code != ErrorCode.UNAVAILABLE:
            break
    return refused.value.code


async def _put(bucket: Any, key: str, value: bytes) -> bool:
    try:
        await bucket.put(key, value)
    except (nats.errors.NoRespondersError, nats.js.errors.NoStreamResponseError) as exc:
        raise AssertionError(f"the bucket does not answer yet: {exc!r}") from exc
    return True


async def _bucket(nc: Any, name: str) -> Any:
    """The key-value bucket `name`, made if missing. On a busy cluster the JetStream API
    may not answer while its servers choose a new metadata leader: that is "not yet"."""
    try:
        return await nc.jetstream(timeout=15).create_key_value(bucket=name)
    except nats.errors.TimeoutError as exc:
        raise AssertionError(f"the JetStream API does not answer yet: {exc!r}") from exc


async def _has_frames(client: Client, run_id: str) -> bool:
    return (await client.get(run_id)).last_seq > 0


async def test_a_removed_tenant_is_ended_and_forgotten_and_its_name_inherits_nothing(
    broker: Broker, secured: InProcessStack, db_url: str
) -> None:
    root = broker.folder
    prefix = broker.subjects.prefix
    write_env_file(root / ENV_FILE, {"RUNWIRE_PREFIX": prefix})
    write_env_file(
        root / OPERATOR_ENV_FILE,
        {
            "RUNWIRE_NATS_URL": broker.server.url,
            "RUNWIRE_PREFIX": prefix,
            "RUNWIRE_NATS_USER": OPERATOR,
            "RUNWIRE_NATS_PASSWORD": broker.identities.passwords[OPERATOR],
        },
    )
    broker.identities.save(root / IDENTITIES_FILE)
    acme = await broker.tenant("acme")
    globex = await broker.tenant("globex")
    operator = await _as_operator(broker, "acme")
    # Slow enough (two minutes) to be still running when forgotten on a busy cluster; the
    # tenant's end cancels it.
    slow = {"tokens": ["t "] * 2400, "token_delay_ms": 50}
    following = None
    try:
        # What acme leaves behind: runs of a session (one running, one queued behind it),
        # an ended run, a workflow release, a budget and a policy, a LangGraph thread (as
        # the gateway keeps it), and a consumer following its run.
        done = (await acme.submit({"tokens": ["old"]})).run.run_id
        await collect(acme, done)
        running = (await acme.submit(slow, session_id="s")).run.run_id
        await acme.submit(slow, session_id="s", multitask="enqueue")
        assert (await acme.release("greeting", 1, GREETING)).created
        await operator.set_budget(tokens=1000, max_active_runs=5)
        await operator.set_policy(effects=["noop"])
        gateway, _ = await broker.connect(service_user(GATEWAY), inbox=GATEWAY_INBOX)
        threads = await eventually(
            lambda: _bucket(gateway, broker.subjects.threads_bucket), 90, interval=1
        )
        # On a cluster, a stream just made may not answer on every server at once.
        await eventually(lambda: _put(threads, "acme.thread-1", b'{"last_run": "x"}'), 20)
        await eventually(lambda: _put(threads, "globex.thread-1", b'{"last_run": "y"}'), 20)
        await gateway.close()
        # Once the stream holds its frames, a client follows it through a consumer (before
        # that, a run it submitted is read on its subject, without one).
        await eventually(lambda: _has_frames(acme, running), timeout=20)
        following = acme.stream(running)
        await anext(following)
        await eventually(lambda: broker.consumers_of("acme"), timeout=20)
        theirs = (await globex.submit({"tokens": ["not ", "theirs"]})).run.run_id
        # A tenant may neither end nor forget itself (nor anyone): an operator's commands.
        for admin in (acme.end_tenant, acme.forget_tenant):
            with pytest.raises(ClientError) as refused:
                await admin()
            assert refused.value.code == ErrorCode.UNAUTHORIZED
        # While its runs are active, forgetting it deletes nothing.
        not_yet = await operator.forget_tenant()
        assert (not_yet.forgotten, not_yet.active, not_yet.runs) == (False, 2, 0)

        had, _ = remove_tenant(root, "acme")
        said = await end_tenant(root, "acme")
        assert had
        assert said[0] == "2 of its active or queued runs canceled"
        assert said[1] == (
            "forgotten: 3 runs (with their frames, events and effects), 1 workflow "
            "releases, its budget and policy"
        )
        assert said[2].startswith("its frames, events and threads purged from the streams;")
        assert await broker.consumers_of("acme") == 0
        _, transcript = await collect(globex, theirs)
    finally:
        if following is not None:
            await following.aclose()
        await acme.close()
        await globex.close()
    assert transcript.text == "not theirs"  # another tenant's runs go on
    assert await _kept_of(broker, "acme") == dict.fromkeys(
        (
            broker.subjects.run_frames_stream,
            broker.subjects.events_stream,
            f"KV_{broker.subjects.threads_bucket}",
        ),
        0,
    )
    assert sum((await _kept_of(broker, "globex")).values()) > 0

    # The name given again: the new acme sees nothing of the old one.
    add_tenant(root, "acme")
    new = read_env_file(root / "tenants" / "acme.env")
    again = await Client.connect(
        broker.url,
        tenant="acme",
        prefix=prefix,
        user=new["RUNWIRE_NATS_USER"],
        password=new["RUNWIRE_NATS_PASSWORD"],
    )
    try:
        for run_id in (done, running):
            assert await _refusal(partial(again.get, run_id)) == ErrorCode.NOT_FOUND
        budget = await again.budget()
        assert (budget.tokens, budget.used, budget.max_active_runs) == (None, 0, None)
        assert (await again.policy()).version == 0
        # Its release id is free: another definition under it is a new release.
        assert (await again.release("greeting", 1, OTHER_GREETING)).created
    finally:
        await again.close()
        await operator.close()
    db = await asyncpg.connect(db_url)
    try:
        for table in ("runs", "releases", "tenant_budgets", "tenant_policies", "outbox"):
            kept = await db.fetchval(f"SELECT count(*) FROM {table} WHERE tenant = 'acme'")
            assert kept == (1 if table == "releases" else 0), table  # the new release
    finally:
        await db.close()
