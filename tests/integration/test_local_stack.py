"""`make up` returns when the stack serves: a script can use it on the next line."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from pathlib import Path

import asyncpg
import httpx
import pytest
from langgraph_sdk import get_client
from nats.aio.msg import Msg

from runwire.client import Client, ClientError
from runwire.contracts.errors import ErrorCode
from runwire.contracts.health import HealthReply
from runwire.contracts.status import RunStatus
from runwire.contracts.subjects import Subjects
from tests.gateway import sse_frames
from tests.local_stack import ROOT, LocalStack, cli, client_of, local_stack, stack_command
from tests.services import collect, eventually

pytestmark = pytest.mark.integration

SERVICES = ("submitter", "executor", "relay", "recovery")
SLOW_START_S = 3


async def test_a_run_submitted_right_after_up_finishes(tmp_path: Path) -> None:
    # Services that take seconds to start, as on a busy machine: supervisord reports them
    # RUNNING after one second, long before they serve anything.
    async with local_stack(tmp_path, slow_start_s=SLOW_START_S) as stack:
        assert stack.returncode == 0, stack.output
        env = stack.env()
        # Straight away, once each, no retry: what a script does after `make up`.
        client = await client_of(env)
        subjects = Subjects(env["RUNWIRE_PREFIX"])
        try:
            reply = await client.submit({"tokens": ["right", " after", " up"]})
            health = [
                HealthReply.model_validate_json(
                    (await client.nc.request(subjects.health(name), b"{}", timeout=2)).data
                )
                for name in SERVICES
            ]
            with pytest.raises(ClientError) as missing:
                await client.join(str(uuid.uuid4()))
            _, transcript = await collect(client, reply.run.run_id)
            final = await client.get(reply.run.run_id)
        finally:
            await client.close()

        # Each service is connected to Postgres as its own role.
        conn = await asyncpg.connect(env["RUNWIRE_DATABASE_URL"])
        try:
            users = await conn.fetch(
                "SELECT DISTINCT usename FROM pg_stat_activity WHERE datname = current_database()"
            )
        finally:
            await conn.close()
        assert {f"runwire_{name}" for name in SERVICES} <= {u["usename"] for u in users}
        assert reply.duplicate is False
        assert [(h.service, h.ok) for h in health] == [(name, True) for name in SERVICES]
        assert missing.value.code == ErrorCode.NOT_FOUND  # the relay answers joins too
        assert transcript.text == "right after up"
        assert final.status == RunStatus.FINISHED

        # And as a user types it, from the folder `make up` ran in.
        cli = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "runwire.client.cli",
            "submit",
            "--tokens",
            "hi",
            "--watch",
            cwd=tmp_path,
            env={**stack.shell, "PYTHONPATH": str(ROOT)},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(cli.communicate(), 60)
        assert cli.returncode == 0, err.decode()
        queued, text, ended = out.decode().splitlines()
        run_id = queued.split()[1]
        assert (queued, text, ended) == (f"run {run_id} queued", "hi", f"run {run_id} finished")


async def test_tenants_are_identities_the_broker_enforces(tmp_path: Path) -> None:
    async with local_stack(tmp_path) as stack:
        assert stack.returncode == 0, stack.output
        secrets = [stack.env()["RUNWIRE_NATS_PASSWORD"]]
        code, out, err = await cli(stack, "tenant", "add", "acme")
        assert code == 0, err
        acme_env = stack.root / "tenants" / "acme.env"
        acme = stack.env("tenants/acme.env")
        secrets.append(acme["RUNWIRE_NATS_PASSWORD"])
        assert (acme["RUNWIRE_TENANT"], acme["RUNWIRE_NATS_USER"]) == ("acme", "tenant-acme")
        assert acme_env.stat().st_mode & 0o077 == 0  # private
        code, out, err = await cli(
            stack, "--env", str(acme_env), "submit", "--tokens", "hi", "--watch"
        )
        assert code == 0, err
        assert out.splitlines()[1] == "hi"
        # No identity at all: refused by the broker.
        identity = ("RUNWIRE_NATS_USER", "RUNWIRE_NATS_PASSWORD")
        bare = {k: v for k, v in stack.env().items() if k not in identity}
        anonymous = tmp_path / "anonymous.env"
        anonymous.write_text("".join(f"{k}={v}\n" for k, v in bare.items()))
        code, _, err = await cli(stack, "--env", str(anonymous), "get", "x")
        assert code == 1
        assert "UNAUTHORIZED" in err
        # Admin commands need the operator's identity.
        code, _, err = await cli(stack, "budget", "--tokens", "5")
        assert (code, "UNAUTHORIZED" in err) == (1, True), err
        code, out, err = await cli(
            stack, "--env", str(stack.root / "operator.env"), "budget", "--tokens", "5"
        )
        assert code == 0, err
        # A removed tenant is cut off, its open connection too.
        held = await client_of(acme)
        code, out, err = await cli(stack, "tenant", "remove", "acme")
        assert code == 0, err
        await eventually(lambda: not held.nc.is_connected, timeout=10)
        await held.close()
        assert not acme_env.exists()
        (tmp_path / "gone.env").write_text("".join(f"{k}={v}\n" for k, v in acme.items()))
        code, _, err = await cli(stack, "--env", str(tmp_path / "gone.env"), "get", "x")
        assert (code, "UNAUTHORIZED" in err) == (1, True), err
        code, out, _ = await cli(stack, "tenant", "list")
        assert out.split() == ["default"]
        # No secret reached a log.
        logs = "".join(p.read_text(errors="replace") for p in (stack.root / "logs").glob("*"))
        assert not any(secret in logs for secret in secrets)


async def test_the_gateway_serves_each_tenant_by_its_api_key(tmp_path: Path) -> None:
    async with local_stack(tmp_path) as stack:
        assert stack.returncode == 0, stack.output
        env = stack.env()
        url, key = env["RUNWIRE_GATEWAY_URL"], env["RUNWIRE_API_KEY"]
        assert "gateway answers" in stack.output
        code, _, err = await cli(stack, "tenant", "add", "acme")
        assert code == 0, err
        acme = stack.env("tenants/acme.env")
        assert acme["RUNWIRE_GATEWAY_URL"] == url
        assert acme["RUNWIRE_API_KEY"] != key
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            mine = {"Authorization": f"Bearer {key}"}
            submitted = await http.post(
                "/v1/runs",
                json={"request_id": "r1", "input": {"tokens": ["over", " http"]}},
                headers=mine,
            )
            assert submitted.status_code == 201, submitted.text
            run_id = submitted.json()["run"]["run_id"]
            async with http.stream("GET", f"/v1/runs/{run_id}/frames", headers=mine) as stream:
                frames = [frame async for _, frame in sse_frames(stream)]
            assert frames[-1].data == {"status": "finished"}
            assert "".join(f.data["text"] for f in frames if f.type == "message") == "over http"
            # acme's key is acme's: its own runs, never the default tenant's.
            theirs = {"x-api-key": acme["RUNWIRE_API_KEY"]}
            assert (await http.get(f"/v1/runs/{run_id}", headers=theirs)).status_code == 404
            own = await http.post(
                "/v1/runs", json={"request_id": "a1", "input": {"tokens": ["x"]}}, headers=theirs
            )
            assert own.status_code == 201, own.text
            assert own.json()["run"]["tenant"] == "acme"
            # The official LangGraph client works through the same gateway (its threads
            # in the gateway's bucket, which its broker identity may use).
            sdk = get_client(url=url, api_key=key)
            try:
                thread = await sdk.threads.create(metadata={"project": "tides"})
                found = await sdk.threads.search(metadata={"project": "tides"})
                assert [t["thread_id"] for t in found] == [thread["thread_id"]]
                parts = [
                    part
                    async for part in sdk.runs.stream(
                        thread["thread_id"],
                        "scripted",
                        input={"tokens": ["lang", "graph"]},
                        stream_mode="messages-tuple",
                    )
                ]
            finally:
                await sdk.http.client.aclose()
            chunks = [p.data[0]["content"] for p in parts if p.event == "messages"]
            assert chunks == [
                "lang",
                "graph",
                "",
            ]  # the message's closing chunk, as LangGraph sends
            # A removed tenant's key opens nothing.
            code, _, err = await cli(stack, "tenant", "remove", "acme")
            assert code == 0, err
            refused = await http.get(f"/v1/runs/{own.json()['run']['run_id']}", headers=theirs)
            assert refused.status_code == 401
        keys = (stack.root / "api-keys.json").read_text()
        logs = "".join(p.read_text(errors="replace") for p in (stack.root / "logs").glob("*"))
        assert key not in keys  # only its hash
        assert key not in logs
        assert acme["RUNWIRE_API_KEY"] not in logs


async def test_up_names_the_service_that_never_answers_and_its_log(tmp_path: Path) -> None:
    # The executor starts too late to answer in time; the others answer.
    async with local_stack(
        tmp_path, start_timeout=20, slow_start_s=120, slow_modules=("runwire.executor",)
    ) as stack:
        assert stack.returncode == 1, stack.output
        log = stack.root / "logs" / "executor.log"
        lines = stack.output.splitlines()
        headline = next(line for line in lines if line.startswith("The stack did not come up"))
        assert headline == (
            "The stack did not come up: executor did not answer a health request within 20 s."
        )
        detail = next(line for line in lines if line.startswith("  executor: "))
        assert detail == f"  executor: RUNNING, no answer; last lines of {log}:"
        answered = {line.split()[0] for line in lines if " answers (" in line}
        assert answered == {"submitter", "relay", "recovery"}
        assert "make up START_TIMEOUT=120" in stack.output


BROKEN_RUNNER = """\
# A user's runner whose package lacks a dependency.
raise ImportError("echo needs the package 'frobnicate', which is not installed")
"""

ECHO_RUNNER = """\
import runwire


async def echo(ctx: runwire.AttemptContext) -> dict[str, str]:
    await ctx.message(str(ctx.input["text"]))
    return {}
"""


async def test_up_stops_at_once_when_a_service_refuses_its_configuration(
    tmp_path: Path,
) -> None:
    """A runner that cannot be loaded (a bad RUNWIRE_RUNNERS entry, a module raising
    ImportError) stops its service at start; `up` says why as soon as it exits, with
    exit status 2, instead of waiting for an answer that never comes."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "broken_runner.py").write_text(BROKEN_RUNNER)
    began = time.monotonic()
    async with local_stack(
        tmp_path,
        start_timeout=120,
        PYTHONPATH=str(plugins),
        RUNWIRE_RUNNERS="echo=broken_runner:echo",
    ) as stack:
        took = time.monotonic() - began
        assert stack.returncode == 2, stack.output
        lines = stack.output.splitlines()
        headline = next(line for line in lines if line.startswith("The stack did not come up"))
        assert headline == (
            "The stack did not come up: executor, submitter refused their configuration "
            "(exit status 2)."
        )
        for service in ("executor", "submitter"):
            detail = next(line for line in lines if line.startswith(f"  {service}: "))
            assert detail.startswith(
                f"  {service}: {service} cannot start: RUNWIRE_RUNNERS runner echo = "
                "'broken_runner:echo': cannot load 'broken_runner:echo': echo needs the "
                "package 'frobnicate', which is not installed; last lines of "
            ), detail
        assert "`make down` and `make up`" in stack.output
        assert "START_TIMEOUT" not in stack.output
        # Long before the start timeout, or supervisord's giving up on the restarts.
        assert took < 45, stack.output


async def test_a_runner_installed_after_up_is_served_after_a_restart(tmp_path: Path) -> None:
    """`runwire runners` shows what each service loaded; a runner installed after `up`
    is unknown until `make down && make up`, which sets the first start's logs aside."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    async with local_stack(tmp_path, PYTHONPATH=str(plugins)) as stack:
        assert stack.returncode == 0, stack.output
        code, out, err = await cli(stack, "runners")
        assert code == 0, err
        before = _loaded(out)
        assert set(before) == {"executor", "submitter"}, out
        assert "scripted" in before["executor"]
        assert "scripted" in before["submitter"]
        # Installed now: not known to the running services.
        (plugins / "echo_runner.py").write_text(ECHO_RUNNER)
        echo = ("submit", "--runner", "echo", "--input", '{"text": "hi"}', "--watch")
        code, _, err = await cli(stack, *echo)
        assert (code, "INVALID_REQUEST" in err) == (1, True), err
        code, out, err = await cli(stack, "runners")
        assert (code, _loaded(out)) == (0, before), err

        code, output = await stack_command(stack.folder, "down", stack.shell)
        assert code == 0, output
        shell = {**stack.shell, "RUNWIRE_RUNNERS": "echo=echo_runner:echo"}
        code, output = await stack_command(stack.folder, "up", shell)
        assert code == 0, output
        code, out, err = await cli(stack, "runners")
        assert code == 0, err
        after = _loaded(out)
        assert after == {name: sorted([*runners, "echo"]) for name, runners in before.items()}
        assert "serves: " + ", ".join(after["executor"]) in out
        code, out, err = await cli(stack, *echo)
        assert code == 0, err
        assert out.splitlines()[1:] == ["hi", out.splitlines()[0].replace("queued", "finished")]

        # The first start's logs are set aside; `make logs` follows this start's only.
        logs, previous = stack.root / "logs", stack.root / "logs" / "previous"
        for folder in (logs, previous):
            assert (folder / "executor.log").read_text().count('"executor starting"') == 1
        followed = await _follow_logs(stack)
        assert followed.count('"msg":"executor starting"') == 1, followed
        assert f"(The logs of the start before are in {previous}.)" in followed
        assert "previous/" not in followed.replace(f"in {previous}.", "")


def _loaded(out: str) -> dict[str, list[str]]:
    """What `runwire runners` says each service loaded."""
    return {
        line.split()[0]: line.split("loaded: ")[1].split("  ")[0].split(", ")
        for line in out.splitlines()
    }


async def _follow_logs(stack: LocalStack) -> str:
    """What `make logs` shows at once (it follows the logs until stopped: stopped here)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "runwire.infra.stack",
        "--root",
        str(stack.root),
        "logs",
        cwd=ROOT,
        env=stack.shell,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert proc.stdout is not None
    shown = ""
    try:
        # The files in name order: supervisord's log comes last.
        while "supervisord.log <==" not in shown or not shown.endswith("\n"):
            chunk = await asyncio.wait_for(proc.stdout.read(65536), 20)
            if not chunk:
                break
            shown += chunk.decode(errors="replace")
    finally:
        proc.kill()
        await proc.wait()
    return shown


async def test_a_clustered_stack_replicates_every_stream_and_runs_two_of_each_service(
    tmp_path: Path,
) -> None:
    async with local_stack(tmp_path, cluster=3, start_timeout=120) as stack:
        assert stack.returncode == 0, stack.output
        assert "a JetStream cluster of 3" in stack.output
        env = stack.env()
        urls = env["RUNWIRE_NATS_URL"].split(",")
        assert len(set(urls)) == 3
        code, out, err = await cli(stack, "submit", "--tokens", "on", " three", "--watch")
        assert code == 0, err
        assert "on three" in out
        ended = out.split()[1]
        # `runwire top` as the default tenant and as the operator, while a run's job is in
        # the jobs stream: both runs in its history, nothing refused, nothing timed out.
        slow = ["--tokens", *(["x"] * 60), "--token-delay-ms", "500"]
        code, out, err = await cli(stack, "submit", *slow)
        assert code == 0, err
        running = out.split()[1]
        for identity in ((), ("--env", str(stack.root / "operator.env"))):
            code, out, err = await cli(stack, *identity, "top", "--once")
            assert code == 0, err
            assert {ended, running} <= set(out.split()), out
            assert not [line for line in out.splitlines() if line.startswith("!")], out
        code, _, err = await cli(stack, "cancel", running)
        assert code == 0, err
        operator = stack.env("operator.env")
        client = await client_of(operator)
        try:
            js = client.nc.jetstream()
            prefix = env["RUNWIRE_PREFIX"].upper()
            for name in ("JOBS", "EVENTS", "RUN_FRAMES"):
                info = await js.stream_info(f"{prefix}_{name}")
                assert info.config.num_replicas == 3, name
                assert info.cluster is not None
                assert len(info.cluster.replicas or []) == 2, name  # beside the leader
            for service in SERVICES:
                replies = await client.health(service)
                assert len({reply.instance for reply in replies}) == 2, service
                assert all(reply.ok for reply in replies), replies
            await _reply_subject_attack(stack.root, env, client)
        finally:
            await client.close()
        # The servers' configuration holds no password, only hashes.
        auth = (stack.root / "nats-auth.conf").read_text()
        for secret in (env["RUNWIRE_NATS_PASSWORD"], operator["RUNWIRE_NATS_PASSWORD"]):
            assert secret not in auth
        # `up` again, without --cluster: the running stack is found as it is, on its ports.
        ports = (stack.root / "ports.json").read_text()
        code, output = await stack_command(stack.folder, "up", stack.shell)
        assert code == 0, output
        assert "already running" in output
        assert (stack.root / "ports.json").read_text() == ports
        # Each replica of a service is connected first to a server of its own.
        conf = (stack.root / "supervisord.conf").read_text()
        for service in SERVICES:
            firsts = {
                line.split("RUNWIRE_NATS_URL=")[1].split(",")[0].strip('"')
                for line in _program_environments(conf, service)
            }
            assert len(firsts) == 2, (service, firsts)


async def _reply_subject_attack(root: Path, env: dict[str, str], operator: Client) -> None:
    """As the default tenant, on the clustered stack: a submit whose reply subject names
    a jobs subject is neither carried out nor answered there."""
    subjects = Subjects(env["RUNWIRE_PREFIX"])
    target = subjects.job("scripted", str(uuid.uuid4()))
    landed: list[bytes] = []

    async def seen(msg: Msg) -> None:
        landed.append(msg.data)

    def refused() -> bool:
        logs = (path.read_text() for path in (root / "logs").glob("submitter*.log"))
        return any("its reply subject is outside the tenant's inbox" in text for text in logs)

    watch = await operator.nc.subscribe(target, cb=seen)
    await operator.nc.flush()
    tenant = await client_of(env)
    try:
        body = b'{"v": 1, "request_id": "attack", "input": {"tokens": ["x"]}}'
        await tenant.nc.publish(subjects.command("default", "submit"), body, reply=target)
        await tenant.nc.flush()
        await eventually(refused, timeout=20)  # a submitter's log says so
        again = await tenant.submit({"tokens": ["mine"]}, request_id="attack")
        await operator.nc.flush()
    finally:
        await tenant.close()
        await watch.unsubscribe()
    assert again.duplicate is False  # the refused submit created nothing
    assert landed == []


def _program_environments(conf: str, service: str) -> list[str]:
    """The `environment=` lines of supervisord's programs `<service>-1`, `<service>-2`."""
    found = []
    for block in conf.split("[program:")[1:]:
        name, _, body = block.partition("]")
        if name.rsplit("-", 1)[0] == service:
            found += [line for line in body.splitlines() if "RUNWIRE_NATS_URL=" in line]
    return found
