"""NATS over TLS: with `RUNWIRE_NATS_TLS_CA` every service and client connects with TLS
and checks the server's certificate against that authority; a client that does not
trust it (or speaks plain NATS) gets nowhere, so nobody on the path reads or forges
commands, frames or credentials."""

import asyncio
import datetime as dt
import ipaddress
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from runwire import ClientError
from runwire.client import Client
from runwire.contracts.errors import ErrorCode
from runwire.infra.embedded import EmbeddedNats
from tests.local_stack import ROOT
from tests.services import InProcessStack, collect

pytestmark = [pytest.mark.integration, pytest.mark.security]


def _authority(
    folder: Path, name: str
) -> tuple[Path, x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A certificate authority of a test's own: (its certificate's file, it, its key)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    path = folder / f"{name}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path, cert, key


def _server_certificate(
    folder: Path, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey
) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, signed by `ca`: (its file, its key's)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nats")]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    cert_path, key_path = folder / "server.pem", folder / "server-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@pytest.fixture
async def tls_server(tmp_path: Path) -> AsyncIterator[tuple[EmbeddedNats, Path, Path]]:
    """A nats-server that speaks only TLS; (it, its authority's file, another's)."""
    ca_path, ca, ca_key = _authority(tmp_path, "runwire-test-ca")
    other_ca, _, _ = _authority(tmp_path, "someone-else")
    server = EmbeddedNats(tmp_path / "nats", tls=_server_certificate(tmp_path, ca, ca_key))
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
