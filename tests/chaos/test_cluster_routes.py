"""A server that does not know the cluster's route secret is not let into the cluster:
routes are authenticated, so whoever reaches a route port cannot join a server of its
own and read the streams it would be given a share of. Over TLS, a server also needs a
certificate of the cluster's authority, and nobody on the path reads the routes."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import ssl
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from runwire.infra.embedded import EmbeddedNats, EmbeddedNatsCluster, RouteTls
from runwire.infra.processes import find_free_port
from runwire.testing.waiting import eventually, fault_window
from tests.certificates import authority, server_certificate

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


def _refused_by(log: str) -> set[str]:
    """The servers that refused a route of the server whose log this is."""
    refused = set(re.findall(r"- (rid:\d+) - Route Error 'Authorization Violation'", log))
    closed = re.findall(r"- (rid:\d+) - Router connection closed: .* - Remote: (\S+)", log)
    return {name for rid, name in closed if rid in refused}


async def _no_route_lasts(monitor_port: int) -> None:
    """A refused server keeps dialling, so a connection may be listed for the moment between
    its dial and the refusal; none of them is still there a moment later."""
    before = {r["rid"] for r in _routes(monitor_port)}
    await fault_window(1.5, "the intruder dials again and is refused again")
    assert before.isdisjoint({r["rid"] for r in _routes(monitor_port)})


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
        # Every server of the cluster refuses it.
        await eventually(
            lambda: _refused_by(intruder.log_path.read_text()) >= {"n1", "n2", "n3"}, timeout=20
        )
        assert intruder.node is not None
        await _no_route_lasts(intruder.node.monitor_port)
        for node in cluster.nodes:
            assert node.node is not None
            names = {r.get("remote_name") for r in _routes(node.node.monitor_port)}
            assert "n9" not in names
    finally:
        await asyncio.to_thread(intruder.stop)


def _route_greeting(port: int, tls: ssl.SSLContext | None = None) -> bytes:
    """What a server's route port says first to a connection (over TLS with `tls`)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as plain:
        if tls is None:
            return plain.recv(512)
        with tls.wrap_socket(plain, server_hostname="127.0.0.1") as conn:
            return conn.recv(512)


async def test_routes_speak_tls_and_a_server_without_a_certificate_of_the_cluster_is_kept_out(
    tmp_path: Path,
) -> None:
    ca_path, ca, ca_key = authority(tmp_path, "cluster-ca")
    cert, key = server_certificate(tmp_path, ca, ca_key)
    servers = EmbeddedNatsCluster(tmp_path / "nats", 3, route_tls=RouteTls(cert, key, ca_path))
    await asyncio.to_thread(servers.start)
    try:
        first = servers.nodes[0].node
        assert first is not None
        assert {r.get("remote_name") for r in _routes(first.monitor_port)} == {"n2", "n3"}
        # Nothing in the clear; over TLS, with a certificate of the cluster, its INFO.
        assert _route_greeting(first.route_port) == b""
        cluster_tls = ssl.create_default_context(cafile=ca_path)
        cluster_tls.load_cert_chain(cert, key)
        assert _route_greeting(first.route_port, cluster_tls).startswith(b"INFO ")

        # One that knows the route secret, with a certificate of another authority.
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        other_ca_path, other_ca, other_key = authority(elsewhere, "someone-else")
        other_cert, other_cert_key = server_certificate(elsewhere, other_ca, other_key)
        intruder = EmbeddedNats(
            tmp_path / "intruder",
            node=replace(
                first,
                server_name="n9",
                route_port=find_free_port(),
                monitor_port=find_free_port(),
                route_tls=RouteTls(other_cert, other_cert_key, other_ca_path),
            ),
        )
        await asyncio.to_thread(intruder.start)
        try:
            await eventually(
                lambda: (
                    "tls" in intruder.log_path.read_text().lower()
                    and "error" in intruder.log_path.read_text().lower()
                ),
                timeout=20,
            )
            assert intruder.node is not None
            await _no_route_lasts(intruder.node.monitor_port)
            for node in servers.nodes:
                assert node.node is not None
                assert "n9" not in {r.get("remote_name") for r in _routes(node.node.monitor_port)}
        finally:
            await asyncio.to_thread(intruder.stop)
    finally:
        await asyncio.to_thread(servers.stop)
