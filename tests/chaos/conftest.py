"""Chaos fixtures: every service as a real process that a test can kill, pause or restart."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from services.client import Client
from services.runtime.store import Store
from tests.services import ServiceProcess, process_env, wait_ready

MODULES = {
    "submitter": "services.submitter",
    "executor": "services.executor",
    "relay": "services.relay",
    "recovery": "services.recovery",
}


class ProcessStack:
    """Named service processes sharing one test's database and prefix."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = env
        self.log_dir = log_dir
        self.procs: dict[str, ServiceProcess] = {}
        self.client: Client
        self.store: Store

    def start(self, name: str, kind: str | None = None, **settings: Any) -> ServiceProcess:
        """Start service `kind` (default: the name without a suffix) as process `name`."""
        module = MODULES[kind or name.split("-")[0]]
        extra = {"executor_id": name} if module == MODULES["executor"] else {}
        proc = ServiceProcess(
            name, module, process_env(self.env, **extra, **settings), self.log_dir
        )
        self.procs[name] = proc.start()
        return proc

    async def open(self) -> None:
        self.client = await Client.connect(
            self.env["RUNWIRE_NATS_URL"], prefix=self.env["RUNWIRE_PREFIX"]
        )
        self.store = await Store.connect(self.env["RUNWIRE_DATABASE_URL"], pool_size=2)
        await wait_ready(self.client)

    async def close(self) -> None:
        await self.client.close()
        await self.store.close()
        for proc in self.procs.values():
            proc.stop()

    def logs(self) -> str:
        return "\n".join(f"===== {n}\n{p.logs()[-4000:]}" for n, p in self.procs.items())


@pytest.fixture
async def processes(
    service_env: dict[str, str], tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[ProcessStack]:
    """Submitter, relay and recovery started; executors are started by each test."""
    stack = ProcessStack(service_env, tmp_path)
    for name in ("submitter", "relay", "recovery"):
        stack.start(name)
    try:
        await stack.open()
        yield stack
    finally:
        report = request.node.stash.get(FAILED, False)
        await stack.close()
        if report:
            print(stack.logs())


FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call" and report.failed:
        item.stash[FAILED] = True
    return report
