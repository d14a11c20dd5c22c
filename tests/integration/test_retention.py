"""Frame retention: a run leaves the stream, then Postgres; joins stay correct throughout."""

from datetime import timedelta

import pytest

from runwire.client import ClientError
from runwire.contracts.errors import ErrorCode
from runwire.testing.servers import Servers
from runwire.testing.waiting import eventually
from tests.services import InProcessStack, collect

pytestmark = pytest.mark.integration


async def _row(stack: InProcessStack, run_id: str, field: str) -> bool:
    run = await stack.store.get_run_by_id(run_id)
    return bool(run and getattr(run, field))


async def _stream_empty(stack: InProcessStack, run_id: str) -> bool:
    js = stack.client.nc.jetstream()
    info = await js.stream_info(
        stack.client.subjects.run_frames_stream,
        subjects_filter=stack.client.subjects.run_frames("default", run_id),
    )
    return not info.state.subjects


async def test_purged_from_the_stream_then_served_from_postgres(
    infra: Servers, db_url: str, prefix: str
) -> None:
    overrides = {"stream_purge_grace": timedelta(milliseconds=300)}
    stack = await InProcessStack(
        infra.nats_url, db_url, prefix, db_roles=infra.service_roles, overrides=overrides
    ).start()
    try:
        reply = await stack.client.submit({"tokens": ["kept", " for", " a", " day"]})
        run_id = reply.run.run_id
        frames, _ = await collect(stack.client, run_id)
        await eventually(lambda: _stream_empty(stack, run_id), timeout=15)

        again, transcript = await collect(stack.client, run_id)
        assert [f.model_dump() for f in again] == [f.model_dump() for f in frames]
        assert transcript.text == "kept for a day"
        tail, _ = await collect(stack.client, run_id, after=len(frames) - 2)
        assert [f.seq for f in tail] == [len(frames) - 1, len(frames)]
    finally:
        await stack.close()


async def test_after_the_retention_join_says_the_frames_are_gone(
    infra: Servers, db_url: str, prefix: str
) -> None:
    overrides = {
        "stream_purge_grace": timedelta(milliseconds=200),
        "frame_retention": timedelta(milliseconds=500),
    }
    stack = await InProcessStack(
        infra.nats_url, db_url, prefix, db_roles=infra.service_roles, overrides=overrides
    ).start()
    try:
        reply = await stack.client.submit({"tokens": ["short", " lived"]})
        run_id = reply.run.run_id
        frames, _ = await collect(stack.client, run_id)
        await eventually(lambda: _row(stack, run_id, "frames_expired"), timeout=15)

        with pytest.raises(ClientError) as gone:
            await stack.client.join(run_id, 0)
        assert gone.value.code == ErrorCode.NOT_FOUND
        assert "retention" in gone.value.message
        # The run itself, with its result, is kept; a client that had everything is done.
        run = await stack.client.get(run_id)
        assert run.result == {"text": "short lived"}
        assert [f async for f in stack.client.stream(run_id, after=len(frames))] == []
    finally:
        await stack.close()
