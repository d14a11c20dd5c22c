"""Where an `http` effect may send a request: the guard against server-side request forgery.

A run's effect names any URL its tenant likes, and the executor sends it from inside the
deployment, next to cloud metadata (169.254.169.254), NATS's monitoring port, Postgres
and internal services. So every request, and every redirect hop, is checked here:

- the scheme is `http` or `https`;
- the host is in the operator's allow-list of names, when there is one
  (`RUNWIRE_EFFECT_HTTP_ALLOW_HOSTS`: `api.example.com`, `*.example.com` for any name
  under example.com; unset: any host);
- the name resolves (getaddrinfo) to an address that is public, or inside a network the
  operator allows although it is private (`RUNWIRE_EFFECT_HTTP_ALLOW_NETWORKS`: CIDRs;
  unset: none). Loopback, private (RFC 1918, ULA), link-local, multicast, unspecified,
  reserved, carrier-grade NAT (100.64/10) and other non-global addresses are refused,
  in IPv4-mapped and other IPv6 forms too.

The request then goes to the very address that was checked (its URL's host rewritten
to it, the `Host` header and TLS's server name kept as the name), so a name that
resolves differently a moment later (DNS rebinding) changes nothing.
"""

import asyncio
import ipaddress
import logging
import re
import socket
from dataclasses import dataclass

import httpx

log = logging.getLogger(__name__)

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

SCHEMES = ("http", "https")
HOSTS_SETTING = "RUNWIRE_EFFECT_HTTP_ALLOW_HOSTS"
NETWORKS_SETTING = "RUNWIRE_EFFECT_HTTP_ALLOW_NETWORKS"
# Shared address space (RFC 6598): not private by Python's tables, yet inside a carrier's
# or a cloud's network.
SHARED = ipaddress.IPv4Network("100.64.0.0/10")
# The well-known NAT64 prefix (RFC 6052): its addresses reach the IPv4 address inside.
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
# IPv4-compatible IPv6 addresses (deprecated): `::a.b.c.d`.
COMPATIBLE = ipaddress.IPv6Network("::/96")
_HOST_PATTERN = re.compile(r"^(\*\.)?[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?$")


class OutboundRefused(Exception):
    """The guard refused a request's target (`hop` 0: the first request, so nothing was
    sent; above 0: a redirect after `hop` requests had been sent)."""

    def __init__(self, host: str, reason: str, *, hop: int = 0) -> None:
        super().__init__(f"requests to {host!r} are not allowed: {reason}")
        self.host = host
        self.reason = reason
        self.hop = hop


def embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries and reaches (IPv4-mapped `::ffff:a.b.c.d`,
    IPv4-compatible `::a.b.c.d`, NAT64 `64:ff9b::a.b.c.d`, 6to4, Teredo), if any."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in COMPATIBLE and int(address) > 1:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address in NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    return None


def refusal(address: Address) -> str | None:
    """Why a request must not go to `address` unless the operator allows its network
    (None: it is a public address)."""
    if isinstance(address, ipaddress.IPv6Address):
        inner = embedded_ipv4(address)
        if inner is not None:
            why = refusal(inner)
            if why is not None:
                return f"{why} (IPv4 {inner} inside IPv6)"
            if address.ipv4_mapped is not None or address in NAT64 or address in COMPATIBLE:
                return None  # the IPv4 address inside is where it goes, and it is public
    checks = (
        (address.is_unspecified, "an unspecified address"),
        (address.is_loopback, "a loopback address"),
        (address.is_link_local, "a link-local address"),
        (address.is_multicast, "a multicast address"),
        (
            isinstance(address, ipaddress.IPv4Address) and address in SHARED,
            "a shared (carrier-grade NAT) address",
        ),
        (
            isinstance(address, ipaddress.IPv6Address) and address.is_site_local,
            "a site-local address",
        ),
        (address.is_reserved, "a reserved address"),
        (address.is_private, "a private address"),
        (not address.is_global, "not a public address"),
    )
    return next((why for refused, why in checks if refused), None)


def parse_hosts(text: str) -> tuple[str, ...]:
    """The host names of `RUNWIRE_EFFECT_HTTP_ALLOW_HOSTS` (comma-separated; `*.example.com`
    for any name under example.com), lower-cased; ValueError names a malformed one."""
    hosts = []
    for item in text.split(","):
        host = item.strip().lower().rstrip(".")
        if not host:
            continue
        if not _HOST_PATTERN.match(host):
            raise ValueError(f"{HOSTS_SETTING}: {item.strip()!r} is not a host name or *.domain")
        hosts.append(host)
    return tuple(hosts)


def parse_networks(text: str) -> tuple[Network, ...]:
    """The networks of `RUNWIRE_EFFECT_HTTP_ALLOW_NETWORKS` (comma-separated CIDRs, a bare
    address meaning itself only); ValueError names a malformed one."""
    networks = []
    for item in text.split(","):
        if not item.strip():
            continue
        try:
            networks.append(ipaddress.ip_network(item.strip(), strict=False))
        except ValueError as exc:
            raise ValueError(f"{NETWORKS_SETTING}: {item.strip()!r} is not a CIDR") from exc
    return tuple(networks)


def host_matches(host: str, pattern: str) -> bool:
    """Whether `host` is `pattern`, or a name under `*.domain` (not the domain itself)."""
    if pattern.startswith("*."):
        return host.endswith(pattern[1:])
    return host == pattern


@dataclass(frozen=True)
class OutboundGuard:
    """The operator's limits on where effects send requests (the default: any public
    host, no private network)."""

    hosts: tuple[str, ...] = ()
    networks: tuple[Network, ...] = ()

    @classmethod
    def parse(cls, hosts: str = "", networks: str = "") -> "OutboundGuard":
        """From the settings' text; ValueError when one is malformed."""
        return cls(parse_hosts(hosts), parse_networks(networks))

    def allowed_network(self, address: Address) -> bool:
        """Whether the operator allows `address` although it may be private."""
        candidates: list[Address] = [address]
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            candidates.append(address.ipv4_mapped)
        return any(a.version == n.version and a in n for a in candidates for n in self.networks)

    def why_not(self, address: Address) -> str | None:
        """Why `address` is refused (None: allowed)."""
        return None if self.allowed_network(address) else refusal(address)

    async def pin(self, url: httpx.URL, *, hop: int = 0) -> str:
        """The address to send a request for `url` to: checked, or OutboundRefused."""
        host = url.raw_host.decode("ascii").lower().rstrip(".")
        if url.scheme not in SCHEMES:
            raise OutboundRefused(host, f"scheme {url.scheme!r} is not http or https", hop=hop)
        if not host:
            raise OutboundRefused(host, "the URL has no host", hop=hop)
        if self.hosts and not any(host_matches(host, p) for p in self.hosts):
            raise OutboundRefused(
                host, f"the host is not one the operator allows ({HOSTS_SETTING})", hop=hop
            )
        # Which networks are allowed is the operator's to know, not a tenant's.
        outside = f"outside the networks the operator allows ({NETWORKS_SETTING})"
        try:
            literal: Address | None = ipaddress.ip_address(host)
        except ValueError:
            literal = None
        if literal is not None:
            why = self.why_not(literal)
            if why is not None:
                raise OutboundRefused(host, f"it is {why}, {outside}", hop=hop)
            return str(literal)
        addresses = await _resolve(host, url.port or (443 if url.scheme == "https" else 80))
        reasons: dict[Address, str] = {}
        for address in addresses:
            why = self.why_not(address)
            if why is None:
                return str(address)
            reasons[address] = why
        # The addresses a name has inside the deployment are the operator's to see, not
        # the tenant's: the log has them, the refusal only says what kind they are.
        log.warning(
            "effect request to %s refused: %s",
            host,
            "; ".join(f"{a} is {why}" for a, why in reasons.items()),
        )
        kinds = " and ".join(sorted(set(reasons.values())))
        raise OutboundRefused(host, f"it resolves to {kinds} only, {outside}", hop=hop)


async def _resolve(host: str, port: int) -> list[Address]:
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        # Nothing was sent, but a resolver's hiccup passes: not a definite refusal.
        raise httpx.ConnectError(f"cannot resolve {host!r}: {exc}") from exc
    found: list[Address] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if address not in found:
            found.append(address)
    if not found:
        raise httpx.ConnectError(f"{host!r} has no address")
    return found


class GuardedTransport(httpx.AsyncBaseTransport):
    """An httpx transport that checks every request (each redirect hop is one) with the
    guard and sends it to the address it checked. One per client: it counts the
    requests it sent, so that a refusal says whether one had left already."""

    def __init__(self, guard: OutboundGuard, inner: httpx.AsyncBaseTransport | None = None) -> None:
        self.guard = guard
        self.inner = inner if inner is not None else httpx.AsyncHTTPTransport()
        self.sent = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        address = await self.guard.pin(request.url, hop=self.sent)
        extensions = dict(request.extensions)
        if request.url.scheme == "https":
            # TLS checks the certificate against the name, not the address.
            extensions["sni_hostname"] = request.url.raw_host.decode("ascii")
        pinned = httpx.Request(
            request.method,
            request.url.copy_with(host=address),
            headers=request.headers,  # with the Host header of the name
            stream=request.stream,
            extensions=extensions,
        )
        self.sent += 1
        return await self.inner.handle_async_request(pinned)

    async def aclose(self) -> None:
        await self.inner.aclose()
