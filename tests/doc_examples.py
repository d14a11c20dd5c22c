"""The examples of README.md and docs/*.md, each with the marker, on the line right before
its block, that says how a test runs it:

    <!-- runs: sh -->                a shell block, run with the page's other runnable
                                     blocks, in order, in one shell, against a live stack
    <!-- runs: examples/NAME.py -->  the block is that file, run there (`python FILE`)
    <!-- file: examples/NAME -->     the block is that file, which a later block or a
                                     test uses (a runner, a test, a workflow)
    <!-- excerpt: examples/NAME -->  lines of that file, in its order (which runs elsewhere)
    <!-- not run: WHY -->            shown, not run, for the reason given

Every `python` and `sh` block has one (tests/unit/test_docs.py checks it, and that each
block named after a file is that file; tests/integration/test_examples.py runs them).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = re.compile(r"^<!-- (?P<kind>runs|file|excerpt|not run): (?P<what>.+) -->$")
FENCE = "```"
# Blocks a reader could take for something to run: each needs a marker.
RUNNABLE_LANGUAGES = ("python", "sh")
SHELL = "sh"
# Printed between blocks by a page's script, to tell their outputs apart.
SEPARATOR = "::: runwire docs block :::"


@dataclass(frozen=True)
class Block:
    """A fenced block of a page, and the marker right before it (if any)."""

    page: Path
    line: int  # of the opening fence, from 1
    language: str
    text: str  # every line of it, each ending with a newline
    kind: str | None = None
    what: str | None = None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def file(self) -> Path | None:
        """The example file the block is, if its marker names one."""
        if self.kind in ("runs", "file") and self.what != SHELL:
            return ROOT / str(self.what)
        return None

    @property
    def excerpt_of(self) -> Path | None:
        """The example file the block's lines are taken from, if its marker names one."""
        return ROOT / str(self.what) if self.kind == "excerpt" else None

    @property
    def runs(self) -> bool:
        return self.kind == "runs"

    def command(self) -> str:
        """What a page's script runs for this block."""
        if self.what == SHELL:
            return self.text
        return f"python {shlex.quote(str(self.what))}\n"


def blocks(page: Path) -> list[Block]:
    """Every fenced block of `page`, in order."""
    found: list[Block] = []
    lines = page.read_text().splitlines(keepends=True)
    number = 0
    while number < len(lines):
        line = lines[number]
        number += 1
        if not line.startswith(FENCE):
            continue
        start = number
        while not lines[number].startswith(FENCE):
            number += 1
        text = "".join(lines[start:number])
        number += 1
        marker = MARKER.match(lines[start - 2].strip()) if start >= 2 else None
        found.append(
            Block(
                page,
                start,
                line[len(FENCE) :].strip(),
                text,
                marker["kind"] if marker else None,
                marker["what"] if marker else None,
            )
        )
    return found


def markers(page: Path) -> list[tuple[int, str]]:
    """(line, text) of every marker of `page`, wherever it stands."""
    return [
        (number, line.strip())
        for number, line in enumerate(page.read_text().splitlines(), start=1)
        if MARKER.match(line.strip())
    ]


def script(page: Path) -> tuple[str, list[Block]]:
    """The shell script that runs a page's runnable blocks in order, a separator line
    before each, stopping at the first that fails; and those blocks."""
    runnable = [block for block in blocks(page) if block.runs]
    parts = ["set -eo pipefail\n"]
    for block in runnable:
        parts.append(f"echo {shlex.quote(SEPARATOR)}\n")
        parts.append(block.command())
    return "".join(parts), runnable
