"""Tests wait on events, not on time: a test that sleeps names what the time is for
(`fault_window` for a fault it made, `pace` for its own rhythm) or waits with
`eventually`. Fake servers and runners may take their time: that is what they fake."""

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
BARE_SLEEP = re.compile(r"\b(asyncio|time)\.sleep\((?!0\))")


def test_no_test_sleeps_without_saying_why() -> None:
    offending = [
        f"{path.relative_to(TESTS.parent)}:{number}"
        for path in sorted(TESTS.rglob("test_*.py"))
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if BARE_SLEEP.search(line)
    ]
    assert not offending, f"use eventually, fault_window or pace: {offending}"
