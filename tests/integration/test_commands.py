"""Commands and health as FastStream subscribers: concurrent, always answered, drained on
stop, and every replica answers health."""

import asyncio
import json
import uuid

import asyncpg
import nats.errors
import pytest

from runwire.client.settings import server_urls
from runwire.contracts.commands import GetCommand
from runwire.contracts.errors import ErrorCode, ErrorReply
from runwire.contracts.health import HealthReply
from runwire.contracts.replies import AbortSessionReply, RunReply, SubmitReply
from runwire.runtime.app import Service
from runwire.runtime.commands import Commands
from runwire.runtime.settings import SubmitterSettings
from runwire.testing.servers import Servers
from runwire.testing.waiting import eventually
from tests.services import InProcessStack

pytestmark = pytest.mark.integration


def _submit(session_id: str) -> bytes:
    body = {"request_id": str(uuid.uuid4()), "session_id": session_id, "input": {"tokens": ["x"]}}
    return json.dumps(body).encode()


async def test_a_command_waiting_on_postgres_does_not_hold_up_the_others(
    stack: InProcessStack,
) -> None:
    subject = stack.client.subjects.command("default", "submit")
    # A submit of a session waits for the session's lock, which this test holds.
    async with stack.store.session_lock("default", "busy"):
        waiting = asyncio.create_task(stack.client.nc.request(subject, _submit("busy"), timeout=20))
        # Meanwhile other commands, to the same subscriber and another, are answered.
        other = await stack.client.nc.request(subject, _submit("free"), timeout=5)
        assert SubmitReply.model_validate_json(other.data).run.session_id == "free"
        probe = json.dumps({"v": 1, "run_id": str(uuid.uuid4())}).encode()
        got = await stack.client.nc.request(
            stack.client.subjects.command("default", "get"), probe, timeout=5
        )
        assert ErrorReply.model_validate_json(got.data).error.code == ErrorCode.NOT_FOUND
        assert not waiting.done()
    reply = SubmitReply.model_validate_json((await waiting).data)
    assert reply.run.session_id == "busy"


@pytest.mark.parametrize("tenant", ["has$dollar", "x" * 65])
async def test_a_bad_tenant_in_the_subject_is_refused(stack: InProcessStack, tenant: str) -> None:
    msg = await stack.client.nc.request(
        stack.client.subjects.command(tenant, "submit"), _submit("s"), timeout=10
    )
    error = ErrorReply.model_validate_json(msg.data).error
    assert (error.code, error.retryable) == (ErrorCode.INVALID_REQUEST, False)
    assert "tenant" in error.message


async def test_a_stopping_submitter_answers_the_command_it_took_and_takes_no_more(
    stack: InProcessStack,
) -> None:
    subject = stack.client.subjects.command("default", "submit")
    async with stack.store.session_lock("default", "busy"):
        waiting = asyncio.create_task(stack.client.nc.request(subject, _submit("busy"), timeout=20))

        # The submit is in the submitter's hands once it waits for the session's lock.
        await eventually(lambda: _waiting_for_a_lock(stack.db_url))
        stopping = asyncio.create_task(stack.stop_service("submitter"))

        async def refused() -> bool:
            try:
                await stack.client.nc.request(subject, _submit("late"), timeout=1)
            except nats.errors.NoRespondersError:
                return True
            return False

        # A new command hears at once that nobody takes it; the taken one is still going.
        await eventually(refused, timeout=10)
        assert not waiting.done()
    reply = SubmitReply.model_validate_json((await waiting).data)
    assert reply.run.session_id == "busy"
    await stopping


async def test_every_relay_replica_answers_health(stack: InProcessStack) -> None:
    stack.start_relay("relay-2")
    nc = stack.client.nc

    async def both_answer() -> list[HealthReply]:
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox, max_msgs=2)
        await nc.publish(stack.client.subjects.health("relay"), b"", reply=inbox)
        try:
            return [HealthReply.model_validate_json((await sub.next_msg(1)).data) for _ in "12"]
        except nats.errors.TimeoutError:
            return []  # the second relay is not subscribed yet
        finally:
            await sub.unsubscribe()

    replies = await eventually(both_answer, timeout=15)
    assert {r.service for r in replies} == {"relay"}
    assert all(r.ok and r.dependencies == {"nats": "ok", "postgres": "ok"} for r in replies)


async def _waiting_for_a_lock(db_url: str) -> bool:
    conn = await asyncpg.connect(db_url)
    try:
        waiting = await conn.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        )
    finally:
        await conn.close()
    return bool(waiting)


class _Faulty(Service[SubmitterSettings]):
    """A service whose commands go wrong the ways a handler can."""

    name = "faulty"

    def __init__(self, settings: SubmitterSettings) -> None:
        super().__init__(settings, own_process=False)
        command = Commands(self, "faulty")

        @command("crash", max_bytes=1024)
        async def crash(body: GetCommand) -> RunReply:
            """Fails as a bug would."""
            raise RuntimeError("a bug")

        @command("huge", max_bytes=1024)
        async def huge(body: GetCommand) -> AbortSessionReply:
            """Answers more than a NATS message holds."""
            over = self.broker.nc.max_payload // 1000 + 1
            return AbortSessionReply(canceled=["x" * 1000] * over)


async def test_a_failing_handler_is_answered_and_logged_and_the_service_goes_on(
    infra: Servers, db_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = SubmitterSettings(nats_url=infra.nats_url, database_url=db_url, prefix=prefix)
    service = _Faulty(settings)
    stop = asyncio.Event()
    running = asyncio.create_task(service.serve(stop))
    nc = await nats.connect(server_urls(infra.nats_url))
    body = json.dumps({"v": 1, "run_id": "r"}).encode()

    async def ask(name: str) -> ErrorReply | None:
        try:
            msg = await nc.request(service.subjects.command("acme", name), body, timeout=5)
        except nats.errors.NoRespondersError:
            return None  # not subscribed yet
        return ErrorReply.model_validate_json(msg.data)

    try:
        crashed = await eventually(lambda: ask("crash"))
        assert (crashed.error.code, crashed.error.retryable) == (ErrorCode.UNAVAILABLE, True)
        assert any(
            "command crash failed unexpectedly" in r.getMessage() and r.exc_info
            for r in caplog.records
        )
        too_big = await eventually(lambda: ask("huge"))
        assert (too_big.error.code, too_big.error.retryable) == (
            ErrorCode.PAYLOAD_TOO_LARGE,
            False,
        )
        assert not running.done()
    finally:
        await nc.close()
        stop.set()
        await asyncio.wait_for(running, 15)
