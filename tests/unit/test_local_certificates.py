"""The local stack's certificates (infra/certificates.py): made once, kept across starts,
made again only when missing, unreadable, mismatched or about to expire; the authority
kept whenever it still serves, so that what clients trust stays the same."""

import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from runwire.infra.certificates import (
    RENEW_WITHIN,
    CertificateFiles,
    authority,
    ensure,
    key_pem,
    server_certificate,
    write_certificate,
)

pytestmark = pytest.mark.unit


def _contents(files: CertificateFiles) -> dict[str, bytes]:
    paths = (files.ca, files.ca_key, files.cert, files.key)
    return {path.name: path.read_bytes() for path in paths}


def test_an_authority_and_a_certificate_for_loopback_signed_by_it_are_made_once(
    tmp_path: Path,
) -> None:
    files = CertificateFiles.in_folder(tmp_path / "tls")
    made = ensure(files)
    first = _contents(files)

    assert len(made) == 2
    assert (files.ca_key.stat().st_mode & 0o777, files.key.stat().st_mode & 0o777) == (0o600, 0o600)
    # What a client does with RUNWIRE_NATS_TLS_CA: the certificate checks out for both names.
    context = ssl.create_default_context(cafile=str(files.ca))
    context.load_cert_chain(files.cert, files.key)  # the key is the certificate's
    cert = x509.load_pem_x509_certificate(first["server.pem"])
    ca = x509.load_pem_x509_certificate(first["ca.pem"])
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    # Started again: nothing is made, nothing changes.
    assert ensure(files) == []
    assert _contents(files) == first


def test_a_server_certificate_about_to_expire_is_made_again_under_the_same_authority(
    tmp_path: Path,
) -> None:
    files = CertificateFiles.in_folder(tmp_path)
    ensure(files)
    kept = _contents(files)
    ca = x509.load_pem_x509_certificate(kept["ca.pem"])
    ca_key = load_pem_private_key(kept["ca-key.pem"], password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    cert, key = server_certificate(ca, ca_key, days=RENEW_WITHIN.days - 1)
    write_certificate(files.cert, cert)
    files.key.write_text(key_pem(key))

    made = ensure(files)

    assert [line.split(" (")[0] for line in made] == [
        "a certificate for 127.0.0.1 and localhost signed by it"
    ]
    now = _contents(files)
    assert (now["ca.pem"], now["ca-key.pem"]) == (kept["ca.pem"], kept["ca-key.pem"])
    renewed = x509.load_pem_x509_certificate(now["server.pem"])
    assert renewed.not_valid_after_utc > cert.not_valid_after_utc


@pytest.mark.parametrize("damage", ["server key missing", "server key of another", "not PEM"])
def test_a_server_certificate_that_cannot_serve_is_made_again(tmp_path: Path, damage: str) -> None:
    files = CertificateFiles.in_folder(tmp_path)
    ensure(files)
    kept = _contents(files)
    if damage == "server key missing":
        files.key.unlink()
    elif damage == "server key of another":
        files.key.write_text(key_pem(authority("someone else")[1]))
    else:
        files.cert.write_text("not a certificate")

    assert len(ensure(files)) == 1
    now = _contents(files)
    assert now["ca.pem"] == kept["ca.pem"]
    assert now["server.pem"] != kept["server.pem"]
    x509.load_pem_x509_certificate(now["server.pem"]).verify_directly_issued_by(
        x509.load_pem_x509_certificate(now["ca.pem"])
    )


@pytest.mark.parametrize("damage", ["deleted", "unreadable", "expiring", "not an authority"])
def test_an_authority_that_cannot_serve_is_made_again_with_a_server_certificate(
    tmp_path: Path, damage: str
) -> None:
    files = CertificateFiles.in_folder(tmp_path)
    ensure(files)
    kept = _contents(files)
    if damage == "deleted":
        files.ca.unlink()
    elif damage == "unreadable":
        files.ca_key.write_text("-----BEGIN PRIVATE KEY-----\ngarbage\n-----END PRIVATE KEY-----\n")
    elif damage == "expiring":
        cert, key = authority(days=RENEW_WITHIN.days - 1)
        write_certificate(files.ca, cert)
        files.ca_key.write_text(key_pem(key))
    else:
        # A leaf certificate and its key where the authority should be.
        files.ca.write_bytes(kept["server.pem"])
        files.ca_key.write_bytes(kept["server-key.pem"])

    assert len(ensure(files)) == 2
    now = _contents(files)
    assert now["ca.pem"] not in (kept["ca.pem"], kept["server.pem"])
    assert now["server.pem"] != kept["server.pem"]
    x509.load_pem_x509_certificate(now["server.pem"]).verify_directly_issued_by(
        x509.load_pem_x509_certificate(now["ca.pem"])
    )
