"""`make up` makes a certificate authority of the stack's own (`.runwire/tls/`) and its
nats-servers speak TLS only, with a certificate it signed: whatever `make up` writes for
clients (`.runwire/env`, the operator's, the services', each tenant's) trusts it, and
nothing else gets in. The authority is kept across restarts and made again when it is
gone. The gateway stays plain HTTP unless the shell gives it a certificate."""

from __future__ import annotations

import asyncio
import json
import ssl
from pathlib import Path

import httpx
import nats
import pytest

from runwire.client import Client, ClientError
from runwire.contracts.errors import ErrorCode
from tests.certificates import authority, server_certificate
from tests.local_stack import cli, client_of, local_stack, stack_command
from tests.services import collect

pytestmark = [pytest.mark.integration, pytest.mark.security]

KEYS = ("ca-key.pem", "server-key.pem")


async def _plain_client(url: str, user: str, password: str) -> tuple[dict[str, object], bytes]:
    """A client that speaks plain NATS: (the server's greeting, what it answers a CONNECT
    and a PING sent in the clear)."""
    host, port = url.removeprefix("nats://").split(",")[0].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        info = json.loads((await reader.readline()).removeprefix(b"INFO "))
        connect = {"user": user, "pass": password, "verbose": False, "pedantic": False}
        writer.write(b"CONNECT " + json.dumps(connect).encode() + b"\r\nPING\r\n")
        await writer.drain()
        try:
            answer = await asyncio.wait_for(reader.read(4096), 10)
        except ConnectionError:
            answer = b""
    finally:
        writer.close()
    return info, answer


async def test_up_makes_an_authority_and_nats_speaks_only_tls_with_its_certificate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with local_stack(tmp_path) as stack:
        assert stack.returncode == 0, stack.output
        env = stack.env()
        ca = stack.root / "tls" / "ca.pem"
        url = env["RUNWIRE_NATS_URL"]
        assert url.startswith("nats://127.0.0.1:")
        assert f"clients trust {ca}" in stack.output
        # Every settings file `up` writes trusts the authority, and so does every program.
        for name in ("env", "operator.env", "services/executor.env", "services/relay.env"):
            assert stack.env(name)["RUNWIRE_NATS_TLS_CA"] == str(ca), name
        conf = (stack.root / "supervisord.conf").read_text()
        programs = [block for block in conf.split("[program:")[1:] if "RUNWIRE_PREFIX" in block]
        assert len(programs) == 5  # four services and the gateway
        assert all(f'RUNWIRE_NATS_TLS_CA="{ca}"' in block for block in programs)
        for key in KEYS:
            assert (stack.root / "tls" / key).stat().st_mode & 0o077 == 0, key

        # Plain NATS, even with the right password: no answer, and the server said so.
        info, answer = await _plain_client(
            url, env["RUNWIRE_NATS_USER"], env["RUNWIRE_NATS_PASSWORD"]
        )
        assert info["tls_required"] is True
        assert b"PONG" not in answer
        # TLS trusting the system's authorities (nats-py's default), or another one.
        other, _, _ = authority(tmp_path, "someone-else")
        for tls in (None, ssl.create_default_context(cafile=other)):
            with pytest.raises((nats.errors.Error, OSError, TimeoutError)):
                await nats.connect(
                    url,
                    user=env["RUNWIRE_NATS_USER"],
                    password=env["RUNWIRE_NATS_PASSWORD"],
                    tls=tls,
                    allow_reconnect=False,
                    connect_timeout=2,
                )

        # The CLI as typed where `make up` ran, and the SDK given the settings file alone.
        code, out, err = await cli(stack, "submit", "--tokens", "over", " tls", "--watch")
        assert code == 0, err
        assert out.splitlines()[1] == "over tls"
        assert err == ""  # nothing said about TLS connections closing
        monkeypatch.setenv("RUNWIRE_ENV_FILE", str(stack.root / "env"))
        async with await Client.connect() as client:
            reply = await client.submit({"tokens": ["sdk", " too"]})
            _, transcript = await collect(client, reply.run.run_id)
        assert transcript.text == "sdk too"

        # A tenant added now connects with its settings file alone.
        code, _, err = await cli(stack, "tenant", "add", "acme")
        assert code == 0, err
        acme_env = stack.root / "tenants" / "acme.env"
        assert stack.env("tenants/acme.env")["RUNWIRE_NATS_TLS_CA"] == str(ca)
        code, out, err = await cli(stack, "--env", str(acme_env), "submit", "--tokens", "acme")
        assert code == 0, err
        monkeypatch.setenv("RUNWIRE_ENV_FILE", str(acme_env))
        async with await Client.connect() as acme:
            assert acme.tenant == "acme"
            await collect(acme, out.split()[1])
        # And the operator removes it over TLS.
        code, out, err = await cli(stack, "tenant", "remove", "acme")
        assert code == 0, err
        assert "canceled" in out, out


async def test_the_authority_is_kept_across_restarts_and_made_again_when_deleted(
    tmp_path: Path,
) -> None:
    async with local_stack(tmp_path) as stack:
        assert stack.returncode == 0, stack.output
        tls = stack.root / "tls"
        first = {path.name: path.read_bytes() for path in tls.iterdir()}
        assert sorted(first) == ["ca-key.pem", "ca.pem", "server-key.pem", "server.pem"]
        assert "Made a certificate authority" in stack.output
        # A tenant's settings file as a runwire before TLS wrote it.
        code, _, err = await cli(stack, "tenant", "add", "acme")
        assert code == 0, err
        acme = stack.root / "tenants" / "acme.env"
        lines = acme.read_text().splitlines(keepends=True)
        acme.write_text("".join(line for line in lines if "TLS" not in line))

        code, output = await stack_command(stack.folder, "down", stack.shell)
        assert code == 0, output
        code, output = await stack_command(stack.folder, "up", stack.shell)
        assert code == 0, output
        assert "Made a certificate" not in output
        assert {path.name: path.read_bytes() for path in tls.iterdir()} == first
        # `up` brought the tenant's file up to date: it connects with the file alone.
        code, out, err = await cli(stack, "--env", str(acme), "submit", "--tokens", "hi", "--watch")
        assert code == 0, err
        assert out.splitlines()[1] == "hi"

        # Gone: made again at the next start; what trusted the one before is refused.
        code, output = await stack_command(stack.folder, "down", stack.shell)
        assert code == 0, output
        (tls / "ca.pem").unlink()
        code, output = await stack_command(stack.folder, "up", stack.shell)
        assert code == 0, output
        assert "Made a certificate authority" in output
        again = {path.name: path.read_bytes() for path in tls.iterdir()}
        assert again["ca.pem"] != first["ca.pem"]
        assert again["server.pem"] != first["server.pem"]
        old = tmp_path / "old-ca.pem"
        old.write_bytes(first["ca.pem"])
        env = stack.env()
        with pytest.raises(ClientError) as refused:
            await Client.connect(
                env["RUNWIRE_NATS_URL"],
                tenant="default",
                prefix=env["RUNWIRE_PREFIX"],
                user=env["RUNWIRE_NATS_USER"],
                password=env["RUNWIRE_NATS_PASSWORD"],
                tls_ca=old,
                connect_timeout=2,
            )
        assert refused.value.code == ErrorCode.UNAVAILABLE
        async with await client_of(env) as client:
            reply = await client.submit({"tokens": ["new", " authority"]})
            _, transcript = await collect(client, reply.run.run_id)
        assert transcript.text == "new authority"


async def test_the_gateway_answers_https_only_when_the_shell_gives_it_a_certificate(
    tmp_path: Path,
) -> None:
    ca_file, ca, ca_key = authority(tmp_path, "gateway-ca")
    cert, key = server_certificate(tmp_path, ca, ca_key)
    shell = {"RUNWIRE_GATEWAY_TLS_CERT": str(cert), "RUNWIRE_GATEWAY_TLS_KEY": str(key)}
    async with local_stack(tmp_path, **shell) as stack:
        assert stack.returncode == 0, stack.output
        env = stack.env()
        url = env["RUNWIRE_GATEWAY_URL"]
        assert url.startswith("https://127.0.0.1:")
        assert f"{url} (HTTPS; key: RUNWIRE_API_KEY)" in stack.output
        verified = ssl.create_default_context(cafile=ca_file)
        async with httpx.AsyncClient(base_url=url, verify=verified, timeout=30) as http:
            submitted = await http.post(
                "/v1/runs",
                json={"request_id": "r1", "input": {"tokens": ["https"]}},
                headers={"Authorization": f"Bearer {env['RUNWIRE_API_KEY']}"},
            )
        assert submitted.status_code == 201, submitted.text
        async with httpx.AsyncClient(timeout=5) as http:
            with pytest.raises(httpx.TransportError):
                await http.get(url.replace("https://", "http://") + "/healthz")
