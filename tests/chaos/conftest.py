"""Chaos fixtures: every service as a real process that a test can kill, pause or restart."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.services import ProcessStack


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
