"""NATS over TLS: with `RUNWIRE_NATS_TLS_CA` every service and client connects with TLS
and checks the server's certificate against that authority; a client that does not
trust it (or speaks plain NATS) gets nowhere, so nobody on the path reads or forges
commands, frames or credentials. The gateway, given its certificate, speaks HTTPS only."""

import asyncio
import os
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest

from runwire import ClientError
from runwire.client import Client
from runwire.client.settings import EXIT_CONFIG
from runwire.contracts.errors import ErrorCode
from runwire.infra.embedded import EmbeddedNats
from runwire.infra.processes import find_free_port
from runwire.testing.waiting import eventually
from tests.certificates import authority, server_certificate
from tests.local_stack import ROOT
from tests.services import InProcessStack, collect

pytestmark = [pytest.mark.integration, pytest.mark.security]


@pytest.fixture
async def tls_server(tmp_path: Path) -> AsyncIterator[tuple[EmbeddedNats, Path, Path]]:
    """A nats-server that speaks only TLS; (it, its authority's file, another's)."""
    ca_path, ca, ca_key = authority(tmp_path, "runwire-test-ca")
    other_ca, _, _ = authority(tmp_path, "someone-else")
    server = EmbeddedNats(tmp_path / "nats", tls=server_certificate(tmp_path, ca, ca_key))
    server.start()
    try:
        yield server, ca_path, other_ca
    finally:
        server.stop()


async def test_services_and_clients_speak_tls_and_nothing_else_gets_in(
    tls_server: tuple[EmbeddedNats, Path, Path], db_url: str, prefix: str
) -> None:
    server, ca, other_ca = tls_server
    async with InProcessStack(server.url, db_url, prefix, overrides={"nats_tls_ca": ca}) as stack:
        reply = await stack.client.submit({"tokens": ["over ", "tls"]})
        _, transcript = await collect(stack.client, reply.run.run_id)
        assert stack.client.nc.connected_url is not None
        stack.check_alive()
        # A client that does not trust the servers' authority, or speaks plain NATS.
        for ca_file in (other_ca, None):
            with pytest.raises(ClientError) as refused:
                await Client.connect(
                    server.url,
                    tenant="default",
                    prefix=prefix,
                    tls_ca=ca_file,
                    connect_timeout=2,
                )
            assert refused.value.code == ErrorCode.UNAVAILABLE
        with pytest.raises((nats.errors.Error, OSError, TimeoutError)):
            await nats.connect(server.url, allow_reconnect=False, connect_timeout=2)
        # The CLI too, given the authority as a setting.
        settings = {
            "RUNWIRE_NATS_URL": server.url,
            "RUNWIRE_PREFIX": prefix,
            "RUNWIRE_NATS_TLS_CA": str(ca),
            "PYTHONPATH": str(ROOT),
        }
        cli = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "runwire.client.cli",
            "get",
            reply.run.run_id,
            env={
                **{k: v for k, v in os.environ.items() if not k.startswith("RUNWIRE_")},
                **settings,
            },
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(cli.communicate(), 60)
    assert transcript.text == "over tls"
    assert cli.returncode == 0, err.decode()
    assert '"status": "finished"' in out.decode()


def _gateway(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "runwire.gateway"], env=env, stdout=out, stderr=subprocess.STDOUT
        )


async def test_the_gateway_speaks_https_only_with_its_certificate(
    tmp_path: Path, infra: Any, prefix: str
) -> None:
    ca_path, ca, ca_key = authority(tmp_path, "runwire-test-ca")
    other_ca, _, _ = authority(tmp_path, "someone-else")
    cert, key = server_certificate(tmp_path, ca, ca_key)
    port = find_free_port()
    env = {
        **os.environ,
        "RUNWIRE_NATS_URL": infra.nats_url,
        "RUNWIRE_PREFIX": prefix,
        "RUNWIRE_GATEWAY_PORT": str(port),
        "RUNWIRE_GATEWAY_KEYS_FILE": str(tmp_path / "api-keys.json"),
        "RUNWIRE_GATEWAY_TLS_CERT": str(cert),
        "RUNWIRE_GATEWAY_TLS_KEY": str(key),
    }
    proc = _gateway(env, tmp_path / "gateway.log")
    try:
        async with httpx.AsyncClient(
            verify=ssl.create_default_context(cafile=ca_path), timeout=2
        ) as http:

            async def healthy() -> bool:
                assert proc.poll() is None, (tmp_path / "gateway.log").read_text()
                try:
                    reply = await http.get(f"https://127.0.0.1:{port}/healthz")
                except httpx.TransportError:
                    return False
                return reply.json() == {"ok": True}

            await eventually(healthy, timeout=30)
        # Plain HTTP, or a client that does not trust the gateway's authority: nothing.
        async with httpx.AsyncClient(timeout=2) as http:
            with pytest.raises(httpx.TransportError):
                await http.get(f"http://127.0.0.1:{port}/healthz")
        async with httpx.AsyncClient(
            verify=ssl.create_default_context(cafile=other_ca), timeout=2
        ) as http:
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await http.get(f"https://127.0.0.1:{port}/healthz")
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_gateway_given_a_certificate_without_its_key_does_not_start(
    tmp_path: Path, prefix: str
) -> None:
    _, ca, ca_key = authority(tmp_path, "runwire-test-ca")
    cert, _ = server_certificate(tmp_path, ca, ca_key)
    env = {**os.environ, "RUNWIRE_PREFIX": prefix, "RUNWIRE_GATEWAY_TLS_CERT": str(cert)}
    env.pop("RUNWIRE_GATEWAY_TLS_KEY", None)
    proc = _gateway(env, tmp_path / "gateway.log")
    try:
        assert proc.wait(30) == EXIT_CONFIG
    finally:
        proc.kill()
    said = (tmp_path / "gateway.log").read_text()
    assert "RUNWIRE_GATEWAY_TLS_CERT and RUNWIRE_GATEWAY_TLS_KEY go together" in said
    assert "Traceback" not in said
