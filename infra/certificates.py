"""The local stack's certificates: a certificate authority of its own and, signed by it, a
certificate for its nats-servers (127.0.0.1 and localhost), all EC P-256.

`make up` keeps them in `.runwire/tls/` (`runwire.infra.layout` names the files) and
makes them again only when one is missing, unreadable, no longer matches the others or
expires within `RENEW_WITHIN`: every client of the stack trusts the authority's file
(`RUNWIRE_NATS_TLS_CA`), so it stays the same across restarts. A server certificate made
again under the same authority changes nothing for them. The private keys are readable
by their owner only.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from runwire.infra.auth import write_private

AUTHORITY_NAME = "runwire local certificate authority"
SERVER_NAME = "runwire local nats-server"
# What the local stack's servers are reached as (every URL it writes names 127.0.0.1).
LOCAL_HOSTS = ("127.0.0.1", "localhost")
AUTHORITY_DAYS = 3650
SERVER_DAYS = 397
# A certificate that expires sooner than this is made again at the next `make up`.
RENEW_WITHIN = dt.timedelta(days=30)
# Valid a little before it was made: clocks of a machine's processes may disagree.
BACKDATE = dt.timedelta(minutes=5)

PrivateKey = ec.EllipticCurvePrivateKey


@dataclass(frozen=True)
class CertificateFiles:
    """Where an authority's certificate and key and the servers' certificate and key are."""

    ca: Path
    ca_key: Path
    cert: Path
    key: Path

    @classmethod
    def in_folder(cls, folder: Path) -> CertificateFiles:
        return cls(
            ca=folder / "ca.pem",
            ca_key=folder / "ca-key.pem",
            cert=folder / "server.pem",
            key=folder / "server-key.pem",
        )


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePublicKey, days: float
) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key), critical=False)
    )


def authority(
    name: str = AUTHORITY_NAME, days: float = AUTHORITY_DAYS
) -> tuple[x509.Certificate, PrivateKey]:
    """A new certificate authority: its (self-signed) certificate and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    usage = x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )
    cert = (
        _builder(_name(name), _name(name), key.public_key(), days)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage, critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def server_certificate(
    ca: x509.Certificate,
    ca_key: PrivateKey,
    hosts: tuple[str, ...] = LOCAL_HOSTS,
    days: float = SERVER_DAYS,
) -> tuple[x509.Certificate, PrivateKey]:
    """A new certificate for `hosts` (addresses or names) signed by `ca`, and its key. It
    serves as a client's certificate too: servers of a cluster show it to each other on
    their routes."""
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    issuer_key = ca_key.public_key()
    uses = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    cert = (
        _builder(_name(SERVER_NAME), ca.subject, key.public_key(), days)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key), False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(uses), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def certificate_pem(cert: x509.Certificate) -> bytes:
    """A certificate as a PEM file holds it."""
    return cert.public_bytes(serialization.Encoding.PEM)


def key_pem(key: PrivateKey) -> str:
    """A private key as a PEM file holds it (PKCS #8, unencrypted: the file is private)."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def write_certificate(path: Path, cert: x509.Certificate) -> None:
    """Write a certificate (public: readable by all), replacing the file at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(certificate_pem(cert))
    tmp.chmod(0o644)
    tmp.replace(path)


def _pair(cert_path: Path, key_path: Path) -> tuple[x509.Certificate, PrivateKey] | None:
    """The certificate and key in these files, if both are readable and go together."""
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError):
        return None
    if not isinstance(key, PrivateKey) or key.public_key() != cert.public_key():
        return None
    return cert, key


def _lasting(cert: x509.Certificate) -> bool:
    return cert.not_valid_after_utc - dt.datetime.now(dt.UTC) > RENEW_WITHIN


def _kept_authority(files: CertificateFiles) -> tuple[x509.Certificate, PrivateKey] | None:
    found = _pair(files.ca, files.ca_key)
    if found is None or not _lasting(found[0]):
        return None
    try:
        constraints = found[0].extensions.get_extension_for_class(x509.BasicConstraints)
    except x509.ExtensionNotFound:
        return None
    return found if constraints.value.ca else None


def _server_kept(files: CertificateFiles, ca: x509.Certificate, hosts: tuple[str, ...]) -> bool:
    found = _pair(files.cert, files.key)
    if found is None or not _lasting(found[0]):
        return False
    cert = found[0]
    try:
        cert.verify_directly_issued_by(ca)
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, TypeError, InvalidSignature, x509.ExtensionNotFound):
        return False
    listed = {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}
    listed |= set(names.get_values_for_type(x509.DNSName))
    return set(hosts) <= listed


def ensure(files: CertificateFiles, hosts: tuple[str, ...] = LOCAL_HOSTS) -> list[str]:
    """Keep the authority and the servers' certificate in `files`, or make what is
    missing, unreadable or expiring soon (a new authority, and then a new server
    certificate signed by it); what was made, for a person."""
    made: list[str] = []
    ca = _kept_authority(files)
    if ca is None:
        ca = authority()
        write_private(files.ca_key, key_pem(ca[1]))
        write_certificate(files.ca, ca[0])
        made.append(f"a certificate authority ({files.ca})")
    if made or not _server_kept(files, ca[0], hosts):
        cert, key = server_certificate(*ca, hosts)
        write_private(files.key, key_pem(key))
        write_certificate(files.cert, cert)
        made.append(f"a certificate for {' and '.join(hosts)} signed by it ({files.cert})")
    return made
