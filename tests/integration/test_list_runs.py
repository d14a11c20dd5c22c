"""`list` by time: the runs created in a range, with the other filters and paging, from
the submitter and through the gateway; a range that is no range is refused."""

from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from tests.gateway import serve_gateway
from tests.services import InProcessStack, collect

pytestmark = pytest.mark.integration


async def test_list_keeps_the_runs_created_in_a_time_range(
    stack: InProcessStack, tmp_path: Path
) -> None:
    client = stack.client
    made = [(await client.submit({"tokens": [f"r{i}"]})).run for i in range(4)]
    for run in made:
        await collect(client, run.run_id)
    first, second, third, fourth = made
    ids = [run.run_id for run in made]
    assert first.created_at < second.created_at < third.created_at < fourth.created_at

    since = await client.list_runs(created_after=second.created_at)
    assert [r.run_id for r in since.runs] == ids[:0:-1]  # at or after: the second too
    until = await client.list_runs(created_before=second.created_at)
    assert [r.run_id for r in until.runs] == [first.run_id]  # before: not the second
    middle = await client.list_runs(
        created_after=second.created_at, created_before=fourth.created_at
    )
    assert [r.run_id for r in middle.runs] == [third.run_id, second.run_id]
    # With the other filters, and a page at a time.
    page = await client.list_runs(
        created_after=first.created_at, status="finished", runner="scripted", limit=2
    )
    assert [r.run_id for r in page.runs] == [fourth.run_id, third.run_id]
    assert all(r.runner == "scripted" for r in page.runs)
    rest = await client.list_runs(created_after=second.created_at, limit=2, before=page.next)
    assert ([r.run_id for r in rest.runs], rest.next) == ([second.run_id], None)
    later = await client.list_runs(created_after=fourth.created_at + timedelta(seconds=1))
    assert later.runs == []
    assert [r.run_id for r in (await client.list_runs(status="running")).runs] == []

    key = "rw_test-list-time"
    async with (
        serve_gateway(stack.nats_url, stack.prefix, {key: "default"}, tmp_path) as url,
        httpx.AsyncClient(base_url=url, headers={"x-api-key": key}, timeout=10) as http,
    ):
        # As a browser sends it: UTC with a Z, milliseconds.
        after = second.created_at.isoformat(timespec="microseconds").replace("+00:00", "Z")
        before = fourth.created_at.isoformat()  # an offset: + is %2B in the query
        found = await http.get(
            "/v1/runs", params={"created_after": after, "created_before": before}
        )
        assert found.status_code == 200, found.text
        assert [r["run_id"] for r in found.json()["runs"]] == [third.run_id, second.run_id]
        for bad in (
            {"created_after": "2026-01-02T03:04:05"},  # no time zone
            {"created_after": "yesterday"},
            {"created_after": before, "created_before": after},  # the wrong way round
            {"created_before": "0001-01-01T00:00:00+14:00"},  # no time in UTC
        ):
            refused = await http.get("/v1/runs", params=bad)
            assert (refused.status_code, refused.json()["error"]["code"]) == (
                400,
                "INVALID_REQUEST",
            ), bad
    # The SDK checks the range before it asks (the submitter checks it with the same model).
    with pytest.raises(ValidationError, match="earlier than"):
        await client.list_runs(created_after=fourth.created_at, created_before=first.created_at)
