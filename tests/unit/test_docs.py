"""The README is a front door into docs/; every link lands, and the generated pages
(configuration, CLI) say what the code does now."""

import re
from pathlib import Path

import pytest
from pydantic_settings import BaseSettings

from runwire.infra import docs
from tests import doc_examples

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MOST_LINES = 250
LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings."""
    found = set()
    fenced = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def test_the_readme_is_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MOST_LINES
    linked = {m["target"].split("#")[0] for m in LINK.finditer("\n".join(lines))}
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    # Every page is reachable from the README (the LangGraph SDK notes from the gateway's).
    assert pages - linked <= {"docs/langgraph-sdk.md"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_between_pages_lands(page: Path) -> None:
    broken = []
    for match in LINK.finditer(page.read_text()):
        target = match["target"]
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        landing = (page.parent / path).resolve() if path else page
        lands = landing.exists() and (
            not anchor or landing.suffix != ".md" or anchor in _anchors(landing)
        )
        if not lands:
            broken.append(target)
    assert broken == []


def test_the_generated_pages_are_current() -> None:
    assert docs.main(["--check"]) == 0, "run `make docs`"


def test_every_settings_class_is_on_the_configuration_page() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text()
    shown = set(re.findall(r"<!-- generated: settings [\w.]+:(\w+) -->", page))
    declared = {
        name
        for folder in ("services", "infra")
        for source in (ROOT / folder).rglob("*.py")
        for name in re.findall(r"^class (\w+Settings)\(", source.read_text(), re.MULTILINE)
    }
    assert declared == shown


def test_a_setting_without_a_docstring_cannot_reach_the_page() -> None:
    class Quiet(BaseSettings):
        model_config = {"env_prefix": "RUNWIRE_", "use_attribute_docstrings": True}

        said: int = 1
        """What it is."""
        unsaid: int = 2

    with pytest.raises(docs.MissingDescription, match=r"Quiet\.unsaid"):
        docs.settings_table(Quiet)


def test_a_settings_table_shows_variables_defaults_and_meanings() -> None:
    table = docs.settings_table(docs.import_module("runwire.runtime.settings").RecoverySettings)
    assert (
        "| `RUNWIRE_FRAME_RETENTION` | `PT24H` | An ended run's segments are deleted this long "
        "after it ended (seconds, or ISO 8601: `PT24H`, `P1D`). |"
    ) in table
    assert "RUNWIRE_NATS_URL" not in table  # inherited: on the page once, under every service


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_example_says_how_it_runs(page: Path) -> None:
    unmarked = [
        block.where
        for block in doc_examples.blocks(page)
        if block.language in doc_examples.RUNNABLE_LANGUAGES and block.kind is None
    ]
    assert unmarked == [], "give each a <!-- runs: ... -->, file:, excerpt: or not run: marker"
    # A marker stands right before the block it is about, or it is about nothing.
    marked = {block.line - 1 for block in doc_examples.blocks(page) if block.kind}
    assert [line for line, _ in doc_examples.markers(page) if line not in marked] == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_an_example_named_after_a_file_is_that_file(page: Path) -> None:
    for block in doc_examples.blocks(page):
        if block.what == doc_examples.SHELL:
            assert (block.kind, block.language) == ("runs", "sh"), block.where
        elif block.file is not None:
            assert block.file.is_file(), f"{block.where}: no file {block.what}"
            assert block.text == block.file.read_text(), f"{block.where} is not {block.what}"
            if block.runs:
                assert block.file.suffix == ".py", f"{block.where}: runs only Python files"
        elif block.excerpt_of is not None:
            assert block.excerpt_of.is_file(), f"{block.where}: no file {block.what}"
            assert _in_order(block.text, block.excerpt_of.read_text()), (
                f"{block.where}: not lines of {block.what}, in its order"
            )


def _in_order(excerpt: str, whole: str) -> bool:
    """Whether every line of `excerpt` is a line of `whole` (indentation aside), in the
    same order."""
    lines = iter(line.strip() for line in whole.splitlines())
    return all(
        any(line.strip() == candidate for candidate in lines) for line in excerpt.splitlines()
    )


def test_an_excerpt_is_lines_of_its_file_in_order() -> None:
    whole = "a = 1\nb = 2\nc = 3\n"
    assert _in_order("a = 1\nc = 3\n", whole)
    assert not _in_order("c = 3\na = 1\n", whole)
    assert not _in_order("a = 1\nb = 20\n", whole)
    assert _in_order("b = 2\n", "def f():\n    b = 2\n")
