"""A server that does not know the cluster's route secret is not let into the cluster:
routes are authenticated, so whoever reaches a route port cannot join a server of its
own and read the streams it would be given a share of."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from runwire.infra.embedded import EmbeddedNats, EmbeddedNatsCluster
from runwire.infra.processes import find_free_port
from runwire.testing.waiting import eventually

pytestmark = [pytest.mark.chaos, pytest.mark.security]


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[EmbeddedNatsCluster]:
    servers = EmbeddedNatsCluster(tmp_path / "nats", 3)
    await asyncio.to_thread(servers.start)
    try:
        yield servers
    finally:
        await asyncio.to_thread(servers.stop)


def _routes(monitor_port: int) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{monitor_port}/routez", timeout=5) as answer:
        routes: list[dict[str, Any]] = json.load(answer).get("routes") or []
    return routes


async def test_a_server_without_the_route_secret_is_kept_out(
    cluster: EmbeddedNatsCluster, tmp_path: Path
) -> None:
    first = cluster.nodes[0].node
    assert first is not None
    assert first.route_secret
    # The cluster's servers route to each other with the secret.
    assert {r.get("remote_name") for r in _routes(first.monitor_port)} == {"n2", "n3"}

    # One that knows every route port and the cluster's name, but not the secret.
    intruder = EmbeddedNats(
        tmp_path / "intruder",
        node=replace(
            first,
            server_name="n9",
            route_port=find_free_port(),
            monitor_port=find_free_port(),
            route_secret="guessed",
        ),
    )
    await asyncio.to_thread(intruder.start)
    try:
        await eventually(
            lambda: "authorization violation" in intruder.log_path.read_text().lower(), timeout=20
        )
        assert intruder.node is not None
        assert _routes(intruder.node.monitor_port) == []
        for node in cluster.nodes:
            assert node.node is not None
            names = {r.get("remote_name") for r in _routes(node.node.monitor_port)}
            assert "n9" not in names
    finally:
        await asyncio.to_thread(intruder.stop)
