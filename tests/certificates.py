"""Certificates made in a test: an authority of its own and a server certificate for
127.0.0.1 and localhost signed by it (TLS to NATS, between NATS servers, at the gateway),
made as `make up` makes the local stack's (runwire.infra.certificates), valid for a day."""

from pathlib import Path

from cryptography import x509

from runwire.infra import certificates
from runwire.infra.auth import write_private

DAYS = 1


def authority(folder: Path, name: str) -> tuple[Path, x509.Certificate, certificates.PrivateKey]:
    """A certificate authority of a test's own: (its certificate's file, it, its key)."""
    cert, key = certificates.authority(name, days=DAYS)
    path = folder / f"{name}.pem"
    certificates.write_certificate(path, cert)
    return path, cert, key


def server_certificate(
    folder: Path, ca: x509.Certificate, ca_key: certificates.PrivateKey
) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, signed by `ca`: (its file, its key's)."""
    cert, key = certificates.server_certificate(ca, ca_key, days=DAYS)
    cert_path, key_path = folder / "server.pem", folder / "server-key.pem"
    certificates.write_certificate(cert_path, cert)
    write_private(key_path, certificates.key_pem(key))
    return cert_path, key_path
