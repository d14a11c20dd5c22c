"""Server-side request forgery through effects, attacked as a tenant on the real stack.

A tenant submits a run of the `effect` runner whose input is an `http` request to a URL
of its choosing, and reads the answer in the run's result. It must get nowhere: its
tenant may perform no effect kind until an operator allows one; once allowed, the
executor refuses every address inside the deployment (loopback, link-local cloud
metadata, private networks, in any spelling) unless the operator allows that network,
checks every redirect hop, and copies no endpoint's answer into a run but its status
and id (the whole body only when the request asks for it).

The endpoints are real local HTTP servers. A machine has no public address to redirect
from, so the "public" first hop is 127.0.0.2, the one network the stack allows there;
its redirects to 127.0.0.1 must be refused.
"""

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest

from runwire import ClientError
from runwire.contracts.errors import ErrorCode
from runwire.contracts.replies import RunSummary
from runwire.contracts.status import RunStatus
from runwire.testing.servers import Servers
from tests.effect_server import EffectServer
from tests.runners import charge
from tests.services import InProcessStack, collect

pytestmark = [pytest.mark.integration, pytest.mark.security]

ALLOW_HTTP = "runwire --env .runwire/operator.env --tenant default policy --effects http"
NOT_ALLOWED = "outside the networks the operator allows (RUNWIRE_EFFECT_HTTP_ALLOW_NETWORKS)"


def _http(url: str, **extra: Any) -> dict[str, Any]:
    """The input of an `effect` run: an http effect to `url`."""
    return {"kind": "http", "request": {"url": url, "body": {"amount": 40}, **extra}}


async def _run(stack: InProcessStack, script: dict[str, Any], runner: str) -> RunSummary:
    reply = await stack.client.submit(script, runner=runner, max_attempts=1)
    await collect(stack.client, reply.run.run_id)
    return await stack.client.get(reply.run.run_id)


@contextlib.asynccontextmanager
async def _stack(
    infra: Servers, db_url: str, prefix: str, **overrides: Any
) -> AsyncIterator[InProcessStack]:
    async with InProcessStack(
        infra.nats_url,
        db_url,
        prefix,
        overrides={"stream_replicas": infra.stream_replicas, **overrides},
        db_roles=infra.service_roles,
        runners={"charge": charge},
    ) as stack:
        yield stack


@contextlib.asynccontextmanager
async def _listening(host: str) -> AsyncIterator[EffectServer | None]:
    """An endpoint on `host`, or None on a machine without that address (no IPv6)."""
    server = EffectServer(host)
    try:
        await server.__aenter__()
    except OSError:
        yield None
        return
    try:
        yield server
    finally:
        await server.__aexit__(None, None, None)


async def test_a_tenant_without_a_policy_performs_no_effect(
    infra: Servers, db_url: str, prefix: str
) -> None:
    async with EffectServer() as server, _stack(infra, db_url, prefix) as stack:
        policy = await stack.client.policy()
        # Asked outright: the effect runner with an http request.
        with pytest.raises(ClientError) as refused:
            await stack.client.submit(_http(f"{server.url}/charge"), runner="effect")
        # Hidden in a runner that performs an http effect: refused at its claim.
        hidden = await _run(stack, {"url": f"{server.url}/charge", "amount": 40}, "charge")

    assert (policy.effects, policy.version) == ([], 0)
    assert (refused.value.code, refused.value.retryable) == (ErrorCode.INVALID_REQUEST, False)
    assert "tenant 'default' may not perform effects of kind 'http'" in refused.value.message
    assert ALLOW_HTTP in refused.value.message
    assert hidden.status == RunStatus.FAILED
    assert hidden.error is not None
    assert (hidden.error.code, hidden.error.retryable) == (ErrorCode.EFFECT_FAILED, False)
    assert "tenant 'default' may not perform effects of kind 'http'" in hidden.error.message
    assert ALLOW_HTTP in hidden.error.message
    assert [(e.key, e.state) for e in hidden.effects] == [("charge", "failed")]
    assert server.requests == []


async def test_addresses_inside_the_deployment_are_refused_however_spelled(
    infra: Servers, db_url: str, prefix: str
) -> None:
    async with (
        EffectServer("127.0.0.1") as inside,
        _listening("::1") as inside_v6,
        _listening("127.0.0.2") as front,
        _stack(infra, db_url, prefix, effect_http_allow_networks="127.0.0.2/32") as stack,
    ):
        if front is None:
            pytest.skip("this machine cannot listen on 127.0.0.2 (loopback is 127.0.0.1 only)")
        # Without IPv6 loopback the refusal is checked all the same, reaching nothing.
        port_v6 = inside_v6.port if inside_v6 is not None else 9
        front.redirects["/moved"] = f"{inside.url}/charge"
        front.redirects["/moved-here"] = f"{front.url}/charge"
        await stack.allow_effects("http")
        port = inside.port
        loopback = f"{inside.url}/charge"
        refused = {
            loopback: "requests to '127.0.0.1' are not allowed: it is a loopback",
            f"http://localhost:{port}/charge": "to 'localhost' are not allowed: it resolves to "
            "a loopback address only",
            f"http://2130706433:{port}/charge": "it resolves to a loopback address only",
            "http://169.254.169.254/latest/meta-data/iam/security-credentials/": "link-local",
            f"http://[::1]:{port_v6}/charge": "to '::1' are not allowed: it is a loopback",
            f"http://[::ffff:127.0.0.1]:{port}/charge": "loopback address (IPv4 127.0.0.1 inside",
            f"http://0.0.0.0:{port}/charge": "an unspecified address",
            f"gopher://127.0.0.2:{front.port}/charge": "scheme 'gopher' is not http or https",
        }
        runs = {url: await _run(stack, _http(url), "effect") for url in refused}
        # A status URL is asked later, by whoever reconciles: refused before the request.
        status_url = f"{inside.url}/charges/{{idempotency_key}}"
        probing = await _run(stack, _http(f"{front.url}/charge", status_url=status_url), "effect")
        # An allowed host that redirects inside: its request left, the redirect does not.
        redirected = await _run(stack, _http(f"{front.url}/moved"), "effect")
        # The allowed network works, redirects within it too.
        direct = await _run(stack, _http(f"{front.url}/charge"), "effect")
        moved = await _run(stack, _http(f"{front.url}/moved-here"), "effect")

    for url, why in refused.items():
        run = runs[url]
        assert run.status == RunStatus.FAILED, url
        assert run.error is not None
        assert (run.error.code, run.error.retryable) == (ErrorCode.EFFECT_FAILED, False), url
        assert why in run.error.message, (url, run.error.message)
        assert [(e.key, e.state) for e in run.effects] == [("node", "failed")], url
    assert NOT_ALLOWED in str(runs[loopback].error)
    assert probing.error is not None
    assert "requests to '127.0.0.1' are not allowed" in probing.error.message
    assert redirected.status == RunStatus.FAILED
    assert redirected.error is not None
    assert "a redirect of the effect's request was refused" in redirected.error.message
    assert "requests to '127.0.0.1' are not allowed: it is a loopback" in redirected.error.message
    assert "redirect-body" not in redirected.model_dump_json()  # what the 307 said
    assert [(e.key, e.state) for e in redirected.effects] == [("node", "unknown")]
    assert direct.result is not None
    assert moved.result is not None
    assert direct.result == {"text": "", "status": 200, "id": "ch_1"}
    assert moved.result == {"text": "", "status": 200, "id": "ch_2"}
    # Nothing reached the addresses inside; the allowed one saw only what was allowed.
    assert inside.requests == []
    assert inside_v6 is None or inside_v6.requests == []
    assert Counter(front.requests) == Counter(
        {("POST", "/moved"): 1, ("POST", "/charge"): 2, ("POST", "/moved-here"): 1}
    )


async def test_an_allowed_network_works_and_a_run_keeps_only_what_it_asked_for(
    infra: Servers, db_url: str, prefix: str
) -> None:
    # The test stacks allow 127.0.0.0/8, where the test's endpoints listen.
    async with EffectServer() as server, _stack(infra, db_url, prefix) as stack:
        await stack.allow_effects("http")
        plain = await _run(stack, _http(f"{server.url}/charge"), "effect")
        kept = await _run(stack, _http(f"{server.url}/charge", keep_response=True), "effect")
        declined = await _run(
            stack,
            {"kind": "http", "request": {"url": f"{server.url}/charge", "body": {"amount": 5000}}},
            "effect",
        )
        server.fail_with = 403
        forbidden = await _run(stack, _http(f"{server.url}/charge"), "effect")
        async with _banner(b"SSH-2.0-OpenSSH_9.6 secret-banner\r\n") as banner_url:
            banner = await _run(stack, _http(banner_url), "effect")

    assert plain.result is not None
    assert kept.result is not None
    assert plain.result == {"text": "", "status": 200, "id": "ch_1"}
    assert kept.result == {
        "text": "",
        "status": 200,
        "id": "ch_2",
        "response": {"id": "ch_2", "amount": 40},
    }
    for run, status, body in ((declined, 402, "card declined"), (forbidden, 403, "is down")):
        assert run.status == RunStatus.FAILED
        assert run.error is not None
        assert (run.error.code, run.error.retryable) == (ErrorCode.EFFECT_FAILED, False)
        assert f"HTTP {status}" in run.error.message
        assert body not in run.model_dump_json()
    assert sorted(server.charges.values()) == [1, 1]
    # Not HTTP at all: the error says so, without quoting what the other side sent.
    assert banner.status == RunStatus.FAILED
    assert banner.error is not None
    assert "RemoteProtocolError" in banner.error.message
    assert "secret-banner" not in banner.model_dump_json()


@contextlib.asynccontextmanager
async def _banner(line: bytes) -> AsyncIterator[str]:
    """A service that answers a request with `line`, not HTTP (as SSH or Redis would)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(line + b"\r\n")
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/"
    finally:
        server.close()
