"""Where an http effect may send a request: which addresses are refused, the operator's
allow-lists, and receipts that keep only what was asked (pure logic, no network)."""

import ipaddress

import httpx
import pytest

from runwire.contracts.replies import PolicyReply
from runwire.runners.effects import HttpAdapter, load_effects
from runwire.runners.outbound import (
    OutboundGuard,
    OutboundRefused,
    host_matches,
    parse_hosts,
    parse_networks,
    refusal,
)

pytestmark = [pytest.mark.unit, pytest.mark.security]


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("127.0.0.1", "loopback"),
        ("127.255.0.9", "loopback"),
        ("::1", "loopback"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("172.31.255.255", "private"),
        ("192.168.1.1", "private"),
        ("fd00::1", "private"),
        ("fc00::1", "private"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("100.64.0.1", "carrier-grade NAT"),
        ("100.127.255.254", "carrier-grade NAT"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("240.0.0.1", "reserved"),
        ("255.255.255.255", "reserved"),
        ("192.0.2.1", "private"),  # documentation
        ("fec0::1", "site-local"),
        # IPv6 forms of an IPv4 address reach it: judged as that address.
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:169.254.169.254", "link-local"),
        ("::ffff:10.0.0.1", "private"),
        ("::127.0.0.1", "loopback"),
        ("64:ff9b::a9fe:a9fe", "link-local"),
        ("2002:7f00:1::1", "loopback"),
    ],
)
def test_addresses_inside_the_deployment_are_refused_with_their_reason(
    address: str, why: str
) -> None:
    found = refusal(ipaddress.ip_address(address))
    assert found is not None
    assert why in found


@pytest.mark.parametrize(
    "address", ["93.184.215.14", "8.8.8.8", "2606:4700:4700::1111", "::ffff:8.8.8.8", "1.1.1.1"]
)
def test_public_addresses_pass(address: str) -> None:
    assert refusal(ipaddress.ip_address(address)) is None


def test_an_allowed_network_lets_a_private_address_through_and_nothing_else() -> None:
    guard = OutboundGuard.parse(networks="127.0.0.0/8, 10.20.0.0/16")

    assert guard.why_not(ipaddress.ip_address("127.0.0.1")) is None
    assert guard.why_not(ipaddress.ip_address("::ffff:127.0.0.1")) is None
    assert guard.why_not(ipaddress.ip_address("10.20.3.4")) is None
    assert guard.why_not(ipaddress.ip_address("10.21.0.1")) == "a private address"
    assert guard.why_not(ipaddress.ip_address("::1")) == "a loopback address"
    assert guard.why_not(ipaddress.ip_address("169.254.169.254")) == "a link-local address"


def test_the_settings_are_read_strictly() -> None:
    assert parse_hosts(" API.example.com., *.svc.example.org ,") == (
        "api.example.com",
        "*.svc.example.org",
    )
    assert parse_networks("127.0.0.1, fd00::/8") == (
        ipaddress.ip_network("127.0.0.1/32"),
        ipaddress.ip_network("fd00::/8"),
    )
    assert parse_hosts("") == ()
    assert parse_networks(" ") == ()
    with pytest.raises(ValueError, match="RUNWIRE_EFFECT_HTTP_ALLOW_NETWORKS: 'ten/8'"):
        parse_networks("10.0.0.0/8, ten/8")
    with pytest.raises(ValueError, match=r"RUNWIRE_EFFECT_HTTP_ALLOW_HOSTS: 'http://x\.com'"):
        parse_hosts("http://x.com")


def test_a_wildcard_host_matches_names_under_it_not_the_domain_or_lookalikes() -> None:
    assert host_matches("api.example.com", "*.example.com")
    assert host_matches("a.b.example.com", "*.example.com")
    assert not host_matches("example.com", "*.example.com")
    assert not host_matches("evilexample.com", "*.example.com")
    assert not host_matches("api.example.com.evil.net", "*.example.com")
    assert host_matches("api.example.com", "api.example.com")


async def _refused(guard: OutboundGuard, url: str) -> OutboundRefused:
    with pytest.raises(OutboundRefused) as refused:
        await guard.pin(httpx.URL(url))
    return refused.value


async def test_literal_addresses_schemes_and_hosts_outside_the_list_are_refused() -> None:
    guard = OutboundGuard()
    loopback = await _refused(guard, "http://127.0.0.1:8222/varz")
    metadata = await _refused(guard, "http://169.254.169.254/latest/meta-data/")
    mapped = await _refused(guard, "http://[::ffff:7f00:1]/")
    scheme = await _refused(guard, "file:///etc/passwd")
    listed = await _refused(OutboundGuard.parse(hosts="*.example.com"), "https://8.8.8.8/")

    assert str(loopback) == (
        "requests to '127.0.0.1' are not allowed: it is a loopback address, outside the "
        "networks the operator allows (RUNWIRE_EFFECT_HTTP_ALLOW_NETWORKS)"
    )
    assert "link-local" in str(metadata)
    assert "loopback" in str(mapped)
    assert "scheme 'file' is not http or https" in str(scheme)
    assert "not one the operator allows (RUNWIRE_EFFECT_HTTP_ALLOW_HOSTS)" in str(listed)
    assert {e.hop for e in (loopback, metadata, mapped, scheme, listed)} == {0}
    assert await guard.pin(httpx.URL("https://8.8.8.8/")) == "8.8.8.8"


def test_the_http_adapter_of_the_executor_takes_its_guard() -> None:
    guard = OutboundGuard.parse(networks="127.0.0.0/8")
    own = HttpAdapter()
    adapters = load_effects({"mine": own}, guard=guard)

    assert isinstance(adapters["http"], HttpAdapter)
    assert adapters["http"].guard is guard
    assert adapters["mine"].guard == OutboundGuard()  # made by its owner: public only


def _response(status: int, body: bytes) -> httpx.Response:
    return httpx.Response(status, content=body, headers={"content-type": "application/json"})


def test_a_receipt_keeps_the_status_and_id_and_the_body_only_when_asked() -> None:
    body = b'{"id": "ch_1", "card": "4242", "secret": "s3cr3t"}'
    assert HttpAdapter._receipt(_response(200, body), False) == {"status": 200, "id": "ch_1"}
    assert HttpAdapter._receipt(_response(201, body), True) == {
        "status": 201,
        "id": "ch_1",
        "response": {"id": "ch_1", "card": "4242", "secret": "s3cr3t"},
    }
    assert HttpAdapter._receipt(_response(200, b'{"id": 7}'), False) == {"status": 200, "id": 7}
    for other in (b'{"id": true}', b'{"id": {"a": 1}}', b"[1, 2]", b"<html>metadata</html>"):
        assert HttpAdapter._receipt(_response(200, other), False) == {"status": 200}


def test_a_tenant_without_a_policy_may_perform_no_kind() -> None:
    assert not PolicyReply(tenant="t", effects=[], version=0).allows("http")
    assert not PolicyReply(tenant="t", effects=None, version=0).allows("http")
    assert PolicyReply(tenant="t", effects=None, version=3).allows("http")
    assert PolicyReply(tenant="t", effects=["http"], version=1).allows("http")
    assert not PolicyReply(tenant="t", effects=["noop"], version=1).allows("http")
