"""A tenant's credentials rotated without a moment refused: its previous password and
API keys keep working until the rotation is finished (the keys at most for the grace
given), then the server closes the connections made with the previous password. A
removed tenant's runs end, and only an operator may end them."""

from datetime import timedelta

import pytest

from runwire import ClientError
from runwire.client import Client
from runwire.contracts.errors import ErrorCode
from runwire.contracts.identities import OPERATOR, tenant_user
from runwire.contracts.status import RunStatus
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
from tests.secured import Broker
from tests.services import InProcessStack, collect, eventually

pytestmark = [pytest.mark.integration, pytest.mark.security]


async def _connect(broker: Broker, user: str, password: str) -> Client:
    return await Client.connect(
        broker.server.url,
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


async def test_a_removed_tenants_runs_end_and_only_an_operator_may_end_them(
    broker: Broker, secured: InProcessStack
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
    slow = {"tokens": ["t "] * 200, "token_delay_ms": 50}
    try:
        running = (await acme.submit(slow, session_id="s")).run.run_id
        waiting = (await acme.submit(slow, session_id="s", multitask="enqueue")).run.run_id
        theirs = (await globex.submit({"tokens": ["not ", "theirs"]})).run.run_id
        # A tenant may not end itself (nor anyone): an operator's command.
        with pytest.raises(ClientError) as refused:
            await acme.end_tenant()
        assert refused.value.code == ErrorCode.UNAUTHORIZED

        had, _ = remove_tenant(root, "acme")
        said = await end_tenant(root, "acme")
        assert had
        assert said == "2 of its active or queued runs canceled"
        _, transcript = await collect(globex, theirs)
    finally:
        await acme.close()
        await globex.close()
    operator = await Client.connect(
        broker.server.url,
        tenant="acme",
        prefix=prefix,
        user=OPERATOR,
        password=broker.identities.passwords[OPERATOR],
        inbox="_INBOX",
    )
    try:

        async def ended() -> bool:
            runs = [await operator.get(run_id) for run_id in (running, waiting)]
            return all(run.status == RunStatus.CANCELED for run in runs)

        await eventually(ended, timeout=20)
    finally:
        await operator.close()
    assert transcript.text == "not theirs"  # another tenant's runs go on
