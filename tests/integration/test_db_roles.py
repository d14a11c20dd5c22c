"""Least privilege in Postgres: each service connects as its own role (migration 0015),
runs work end to end that way, and each role is refused what its service never does."""

import asyncio
import logging
import uuid
from typing import Any

import asyncpg
import pytest

from runwire.contracts.identities import SERVICES
from runwire.contracts.status import RunStatus
from runwire.infra.auth import database_url_as, service_role
from runwire.runtime.migrate import main as migrate_main
from runwire.runtime.store import Store
from tests.effect_server import EffectServer
from tests.runners import charge
from tests.services import InProcessStack, collect, eventually

pytestmark = pytest.mark.integration

ROLES = tuple(service_role(service) for service in SERVICES)


@pytest.fixture
def roles(infra: Any) -> None:
    """The service roles may log in (the embedded server's template build allows it)."""
    if not infra.service_roles:
        pytest.skip("the service roles log in without a password only on the embedded server")


async def test_every_service_works_as_its_own_role(
    roles: None, infra: Any, db_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    async with (
        EffectServer() as server,
        InProcessStack(
            infra.nats_url, db_url, prefix, runners={"charge": charge}, db_roles=True
        ) as stack,
    ):
        await stack.client.set_budget(cost=100, max_active_runs=10)
        await stack.allow_effects("http")
        events = await stack.client.events()
        plain = await stack.client.submit({"tokens": ["as", " roles"]}, session_id="s")
        _, transcript = await collect(stack.client, plain.run.run_id)
        paid = await stack.client.submit(
            {"url": f"{server.url}/charge", "amount": 5, "cost": 10}, runner="charge"
        )
        await collect(stack.client, paid.run.run_id)
        slow = await stack.client.submit({"tokens": ["x"] * 100, "token_delay_ms": 20})
        await stack.client.cancel(slow.run.run_id)
        await collect(stack.client, slow.run.run_id)
        runs = [await stack.client.get(r.run.run_id) for r in (plain, paid, slow)]
        budget = await stack.client.budget()
        seen = []

        async def until_canceled() -> None:
            async for event in events:
                seen.append((event.run_id, event.event))
                if event.run_id == slow.run.run_id and event.status == RunStatus.CANCELED:
                    return

        # Run events are published by recovery's sweep, as its role.
        try:
            await asyncio.wait_for(until_canceled(), 20)
        except TimeoutError:
            raise AssertionError(f"run events seen: {seen}, runs: {runs}") from None
        # Every job and frame the services published, they removed from the outbox.
        ids = [uuid.UUID(r.run_id) for r in runs]

        async def outbox_drained() -> bool:
            left = await stack.store._pool.fetchval(
                "SELECT count(*) FROM outbox WHERE run_id = ANY($1)", ids
            )
            return left == 0

        await eventually(outbox_drained)
    assert transcript.text == "as roles"
    assert [r.status for r in runs] == [RunStatus.FINISHED, RunStatus.FINISHED, RunStatus.CANCELED]
    assert (budget.cost_used, budget.cost_reserved) == (10, 0)
    assert list(server.charges.values()) == [1]
    denied = [r.getMessage() for r in caplog.records if "permission denied" in r.getMessage()]
    assert denied == []


# What triggers write with the owner's rights, which no service may call itself: a
# workflow's changes, the outbox, a frame signed with a run's secret.
OWNER_ONLY = [
    "SELECT workflow_fail(r, '{}', 'x') FROM runs r",
    "SELECT workflow_node_create(r, '{}', 'a', 'a', 'x') FROM runs r",
    "SELECT workflow_cancel_runs(gen_random_uuid(), NULL, '{}', 'x', 'y')",
    "SELECT outbox_put('job', 't', gen_random_uuid(), NULL, '{}', NULL, now())",
    "SELECT outbox_frame(r, 1, 1, 'done', '{}') FROM runs r",
]

# Only relays write a run's frames to Postgres.
WRITE_SEGMENTS = "SELECT * FROM write_segments('{}', '{}', '{}', '{}', '{}', '{}')"

DENIED = {
    "runwire_submitter": [
        "DELETE FROM runs",
        "DELETE FROM frame_segments",
        "INSERT INTO runners (name, registered_by) VALUES ('x', 'y')",
        "UPDATE budget_reservations SET state = 'released'",
        "SELECT workflow_sweep(10)",
        WRITE_SEGMENTS,
        *OWNER_ONLY,
    ],
    "runwire_executor": [
        "DELETE FROM runs",
        "UPDATE tenant_budgets SET tokens = 1",
        "INSERT INTO tenant_policies (tenant) VALUES ('x')",
        "DELETE FROM frame_segments",
        "SELECT workflow_sweep(10)",
        WRITE_SEGMENTS,
        *OWNER_ONLY,
    ],
    "runwire_relay": [
        "DELETE FROM runs",
        "UPDATE effects SET state = 'committed'",
        "SELECT * FROM tenant_budgets",
        "INSERT INTO run_events (run_id, event, status, attempt, actor) "
        "VALUES (gen_random_uuid(), 'failed', 'failed', 1, 'x')",
        *OWNER_ONLY,
    ],
    "runwire_recovery": [
        "DELETE FROM runs",
        "UPDATE tenant_budgets SET tokens = 1",
        "INSERT INTO effects (run_id, key, kind, idempotency_key, request, request_digest) "
        "VALUES (gen_random_uuid(), 'k', 'http', 'i', '{}', 'd')",
        "DROP TABLE runs",
        WRITE_SEGMENTS,
        *OWNER_ONLY,
    ],
}


@pytest.mark.parametrize("role", ROLES)
async def test_each_role_is_refused_what_its_service_never_does(
    roles: None, db_url: str, role: str
) -> None:
    conn = await asyncpg.connect(database_url_as(db_url, role))
    refused = []
    try:
        for statement in DENIED[role]:
            try:
                await conn.execute(statement)
            except asyncpg.InsufficientPrivilegeError:
                refused.append(statement)
    finally:
        await conn.close()
    assert refused == DENIED[role]


async def test_a_service_role_waits_for_the_owner_to_migrate(
    roles: None,
    infra: Any,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    name = f"t_fresh_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(infra.admin_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    owner_url = infra.database_url(name)
    # The executor's role connects first: it may not migrate, so it waits.
    connecting = asyncio.create_task(
        Store.connect(database_url_as(owner_url, "runwire_executor"), pool_size=1, timeout=30)
    )

    def waiting() -> bool:
        assert not connecting.done(), "the role connected (or failed) before the migrations"
        return any("may not apply them" in r.getMessage() for r in caplog.records)

    await eventually(waiting, timeout=20)
    await asyncio.to_thread(migrate_main, [owner_url])  # as the owner, its own process would
    store = await asyncio.wait_for(connecting, 30)
    await store.ping()
    await store.close()
    out = capsys.readouterr().out
    assert "applied 0015_service_roles.sql" in out
