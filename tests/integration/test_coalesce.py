"""multitask `coalesce`: runs queued behind a busy session merge into one next run whose
input is the list of theirs, each submit answered with that run, once; `coalesce_ms`
holds a new one back for more inputs even when the session is idle."""

from typing import Any

import pytest

from runwire.contracts.status import RunStatus
from tests.runners import gathers
from tests.services import InProcessStack, collect

pytestmark = pytest.mark.integration

BUSY = {"tokens": ["busy"], "token_delay_ms": 1500}


async def test_runs_behind_a_busy_session_merge_into_one(
    infra: Any, db_url: str, prefix: str
) -> None:
    async with InProcessStack(
        infra.nats_url, db_url, prefix, db_roles=infra.service_roles, runners={"gathers": gathers}
    ) as stack:
        client = stack.client
        first = await client.submit(BUSY, session_id="chat", multitask="enqueue")
        said = []
        for text in ("a", "b", "c"):
            said.append(
                await client.submit(
                    {"text": text},
                    runner="gathers",
                    session_id="chat",
                    multitask="coalesce",
                    request_id=f"say-{text}",
                )
            )
        again = await client.submit(
            {"text": "c"},
            runner="gathers",
            session_id="chat",
            multitask="coalesce",
            request_id="say-c",
        )
        merged = said[0].run.run_id
        _, busy = await collect(client, first.run.run_id)
        _, transcript = await collect(client, merged)
        run = await client.get(merged)
    assert busy.text == "busy"
    assert [s.coalesced for s in said] == [False, True, True]
    assert {s.run.run_id for s in said} == {merged}
    assert (again.duplicate, again.run.run_id) == (True, merged)
    assert transcript.text == "a + b + c"  # one run, every input once, in order
    assert run.result is not None
    assert (run.status, run.result["inputs"], run.attempts) == (RunStatus.FINISHED, 3, 1)


async def test_coalesce_ms_waits_for_more_inputs_on_an_idle_session(
    infra: Any, db_url: str, prefix: str
) -> None:
    async with InProcessStack(
        infra.nats_url, db_url, prefix, db_roles=infra.service_roles, runners={"gathers": gathers}
    ) as stack:
        client = stack.client
        options = {"runner": "gathers", "session_id": "s", "multitask": "coalesce"}
        made = await client.submit({"text": "x"}, coalesce_ms=1500, **options)
        joined = await client.submit({"text": "y"}, **options)
        shown = await client.get(made.run.run_id)
        _, transcript = await collect(client, made.run.run_id)
        events = await stack.store.run_events(made.run.run_id)
    at = {e["event"]: e["at"] for e in events}
    assert (joined.coalesced, joined.run.run_id) == (True, made.run.run_id)
    assert shown.queued_for == "time"
    assert transcript.text == "x + y"
    assert (at["claimed"] - at["submitted"]).total_seconds() >= 1.4
