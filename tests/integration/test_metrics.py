"""Each service, as a real process, serves Prometheus metrics that show what a test did,
on a port of its own and with only its own metric families (plus its process's)."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from runwire.client import Client
from runwire.contracts.status import RunStatus
from runwire.infra.processes import find_free_port, port_is_free
from runwire.testing.waiting import eventually
from tests.local_stack import client_of, local_stack
from tests.services import MODULES, ProcessStack, collect

pytestmark = pytest.mark.integration

# Long enough to still be running when the test looks; the test stops it at the end.
LONG_RUN = {"tokens": [f"t{i} " for i in range(400)], "token_delay_ms": 50}

# What docs/observability.md promises each service fills in (counter families are
# named without `_total` by the parser).
OWN_FAMILIES = {
    "submitter": {"runwire_command_duration_seconds", "runwire_commands_refused"},
    "executor": {
        "runwire_attempts_in_flight",
        "runwire_attempt_duration_seconds",
        "runwire_attempt_outcomes",
        "runwire_retries",
        "runwire_wait_duration_seconds",
        "runwire_rate_limited_calls",
    },
    "relay": {
        "runwire_frames_relayed",
        "runwire_relay_lag_seconds",
        "runwire_command_duration_seconds",
        "runwire_commands_refused",
    },
    "recovery": {
        "runwire_queue_depth",
        "runwire_queue_oldest_age_seconds",
        "runwire_queue_held_runs",
        "runwire_tenant_jobs",
        "runwire_tenant_share_runs",
        "runwire_waiting_runs",
        "runwire_waiting_oldest_seconds",
        "runwire_recoveries",
        "runwire_interrupted_runs",
    },
}

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def page(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


def samples_of(text: str) -> Samples:
    """Every sample of a `/metrics` page, by name and sorted labels."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def families_of(text: str) -> set[str]:
    # The text format carries a family's creation times as a family `<name>_created`.
    return {f.name.removesuffix("_created") for f in text_string_to_metric_families(text)}


def scrape(port: int) -> Samples:
    return samples_of(page(f"http://127.0.0.1:{port}/metrics"))


# On every service's page: what its garbage collections cost it.
GC_FAMILIES = {"runwire_gc_pause_seconds", "runwire_gc_frozen_objects"}


def assert_only_own_families(service: str, text: str) -> None:
    families = families_of(text)
    assert {f for f in families if f.startswith("runwire_")} == OWN_FAMILIES[service] | GC_FAMILIES
    # What the process costs, on every service's page.
    assert {"process_resident_memory_bytes", "process_cpu_seconds"} <= families


@pytest.fixture
async def services(
    service_env: dict[str, str], tmp_path: Path
) -> AsyncIterator[tuple[dict[str, int], Client]]:
    """The four services as processes started by `faststream run`, each serving metrics on
    a port of its own; the executor runs one attempt at a time, so a second run waits in
    the queue."""
    ports = {name: find_free_port() for name in MODULES}
    stack = ProcessStack(service_env, tmp_path)
    for name in MODULES:
        extra = {"max_in_flight": 1} if name == "executor" else {}
        stack.start(
            name, faststream=True, metrics_port=ports[name], metrics_host="127.0.0.1", **extra
        )
    try:
        await stack.open()
        yield ports, stack.client
    finally:
        await stack.close()


async def test_metrics_show_queue_depth_and_attempts_in_flight(
    services: tuple[dict[str, int], Client],
) -> None:
    ports, client = services
    running = (await client.submit(LONG_RUN)).run
    tenant = running.tenant

    async def started() -> bool:
        return (await client.get(running.run_id)).status == RunStatus.RUNNING

    await eventually(started, timeout=15)
    waiting = (await client.submit({"tokens": ["later"]})).run
    assert waiting.status == RunStatus.QUEUED

    async def metrics(name: str) -> Samples:
        return await asyncio.to_thread(scrape, ports[name])

    by_tenant = (("tenant", tenant),)

    async def recovery_sees_one_waiting() -> Samples:
        samples = await metrics("recovery")
        assert samples.get(("runwire_queue_depth", by_tenant)) == 1
        # It has its job (nothing holds it back): two jobs, the running run's and its, of
        # the tenant's share of 64. (A sample of recovery's from before the first run's
        # claim shows one run waiting too, with one job: the first.)
        assert samples.get(("runwire_tenant_jobs", by_tenant)) == 2
        return samples

    samples = await eventually(recovery_sees_one_waiting, timeout=10)
    assert samples[("runwire_queue_oldest_age_seconds", by_tenant)] >= 0
    assert samples[("runwire_queue_held_runs", by_tenant)] == 0
    assert samples[("runwire_tenant_share_runs", by_tenant)] == 64

    async def one_in_flight() -> bool:
        executor = await metrics("executor")
        return executor.get(("runwire_attempts_in_flight", ())) == 1

    await eventually(one_in_flight, timeout=5)

    async def relayed() -> Samples:
        samples = await metrics("relay")
        assert samples.get(("runwire_frames_relayed_total", ()), 0) > 0
        return samples

    relay = await eventually(relayed, timeout=10)
    assert relay[("runwire_relay_lag_seconds_count", ())] > 0

    submitter = await metrics("submitter")
    assert submitter[("runwire_command_duration_seconds_count", (("command", "submit"),))] == 2
    assert submitter[("runwire_command_duration_seconds_count", (("command", "get"),))] >= 1
    # No label names a tenant or a run (unbounded series), and nothing but runwire's
    # families and the process's is served.
    assert not any(tenant in str(labels) for _, labels in submitter)
    assert not any(name.startswith("faststream_") for name, _ in submitter)

    for name, port in ports.items():
        text = await asyncio.to_thread(page, f"http://127.0.0.1:{port}/metrics")
        assert_only_own_families(name, text)
        # What start-up made (tens of thousands of objects) is kept out of collections,
        # so that a full one does not stop the service for tens of milliseconds; young
        # collections are timed.
        gc = samples_of(text)
        assert gc[("runwire_gc_frozen_objects", ())] > 10_000
        assert gc[("runwire_gc_pause_seconds_count", (("generation", "0"),))] > 0


def four_free_ports() -> int:
    """A port P with P .. P+3 free, for `RUNWIRE_METRICS_PORT` under `make up`."""
    while True:
        first = find_free_port()
        if first + 3 <= 65535 and all(port_is_free(first + i) for i in range(1, 4)):
            return first


async def test_make_up_gives_each_service_its_own_metrics_port(tmp_path: Path) -> None:
    first = four_free_ports()
    settings = {"RUNWIRE_METRICS_PORT": str(first), "RUNWIRE_METRICS_HOST": "127.0.0.1"}
    async with local_stack(tmp_path, **settings) as stack:
        assert stack.returncode == 0, stack.output
        env = stack.env()
        urls = {name: env[f"RUNWIRE_METRICS_URL_{name.upper()}"] for name in MODULES}
        assert urls == {
            name: f"http://127.0.0.1:{first + i}/metrics"
            for i, name in enumerate(("submitter", "executor", "relay", "recovery"))
        }
        async with await client_of(env) as client:
            run_id = (await client.submit({"tokens": ["a", "b"]})).run.run_id
            _, transcript = await collect(client, run_id)
        assert transcript.text == "ab"

        async def scraped(name: str) -> Samples:
            return samples_of(await asyncio.to_thread(page, urls[name]))

        finished = ("runwire_attempt_outcomes_total", (("code", "none"), ("outcome", "finished")))

        async def executor_counted_it() -> bool:
            return (await scraped("executor")).get(finished) == 1

        await eventually(executor_counted_it, timeout=10)
        submitter = await scraped("submitter")
        assert submitter[("runwire_command_duration_seconds_count", (("command", "submit"),))] == 1

        async def relay_counted_its_frames() -> bool:
            # Its `run`, one or two `message` frames (the deltas may be joined) and
            # `done`, once the relay has written them (at its `done`, after the attempt).
            relayed = (await scraped("relay")).get(("runwire_frames_relayed_total", ()), 0)
            return relayed >= 3

        await eventually(relay_counted_its_frames, timeout=10)
        for name, url in urls.items():
            assert_only_own_families(name, await asyncio.to_thread(page, url))
