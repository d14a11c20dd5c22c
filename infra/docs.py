"""The pages of `docs/` that are made from the code: the settings of every process (from
their pydantic-settings classes and the docstrings of their fields) and the CLI (from its
parser).

A page keeps its own prose; each generated part sits between a marker line naming what
it shows and `<!-- end generated -->`:

    <!-- generated: settings runwire.runtime.settings:ExecutorSettings -->
    <!-- generated: cli -->

`python -m runwire.infra.docs` (`make docs`) rewrites those parts; with `--check` it
changes nothing and exits 1 naming each page that is stale (a unit test runs it).
"""

import argparse
import contextlib
import os
import re
import sys
from collections.abc import Iterator
from datetime import timedelta
from importlib import import_module
from pathlib import Path

from pydantic import AliasChoices
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

DOCS = Path(__file__).resolve().parents[1] / "docs"
PAGES = ("configuration.md", "cli.md")
END = "<!-- end generated -->"
MARKER = re.compile(r"^<!-- generated: (?P<what>[^>]+?) -->$", re.MULTILINE)
# argparse wraps help to the terminal's width: the page is made at one fixed width.
HELP_WIDTH = "88"


class MissingDescription(ValueError):
    """A setting without a docstring: the configuration page would not say what it is."""


def env_name(cls: type[BaseSettings], name: str, field: FieldInfo) -> str:
    """The environment variable a field is read from (its first alias, if it has any)."""
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return str(alias.choices[0])
    if isinstance(alias, str):
        return alias
    return f"{cls.model_config.get('env_prefix', '')}{name}".upper()


def shown_default(field: FieldInfo) -> str:
    """A field's default as a reader types it into the environment."""
    value = field.default
    if value is PydanticUndefined and field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    if value in (None, "", [], PydanticUndefined):
        return "(none)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, timedelta):
        seconds = int(value.total_seconds())
        for unit, size in (("H", 3600), ("M", 60)):
            if seconds % size == 0:
                return f"`PT{seconds // size}{unit}`"
        return f"`PT{seconds}S`"
    return f"`{value}`"


def settings_table(cls: type[BaseSettings]) -> str:
    """The fields a class declares itself (not those of the class it extends)."""
    inherited: set[str] = set()
    for base in cls.__mro__[1:]:
        if isinstance(base, type) and issubclass(base, BaseSettings) and base is not BaseSettings:
            inherited.update(base.model_fields)
    rows = ["| variable | default | what it is |", "|---|---|---|"]
    for name, field in cls.model_fields.items():
        if name in inherited:
            continue
        if not field.description:
            raise MissingDescription(f"{cls.__name__}.{name} has no docstring")
        meaning = " ".join(field.description.split()).replace("|", "\\|")
        rows.append(f"| `{env_name(cls, name, field)}` | {shown_default(field)} | {meaning} |")
    return "\n".join(rows)


@contextlib.contextmanager
def _help_width() -> Iterator[None]:
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_WIDTH
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = before


def cli_reference() -> str:
    """`runwire --help` and each command's `--help`, as the terminal shows them."""
    from runwire.client.cli import _parser

    with _help_width():
        parser = _parser()
        commands = next(
            action for action in parser._actions if isinstance(action, argparse._SubParsersAction)
        )
        parts = ["```text", parser.format_help().rstrip(), "```"]
        for name, command in commands.choices.items():
            parts += ["", f"### `runwire {name}`", "", "```text"]
            parts += [command.format_help().rstrip(), "```"]
    return "\n".join(parts)


def generate(what: str) -> str:
    kind, _, target = what.partition(" ")
    if kind == "cli":
        return cli_reference()
    if kind == "settings":
        module, _, name = target.partition(":")
        cls = getattr(import_module(module), name)
        return settings_table(cls)
    raise ValueError(f"unknown generated part {what!r}")


def render(text: str) -> str:
    """The page with every generated part made again."""
    out: list[str] = []
    position = 0
    for match in MARKER.finditer(text):
        if match.start() < position:
            continue
        end = text.index(END, match.end())
        out += [text[position : match.end()], "\n", generate(match["what"]), "\n"]
        position = end
    out.append(text[position:])
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    args = parser.parse_args(argv)
    stale = []
    for page in PAGES:
        path = DOCS / page
        text = path.read_text()
        fresh = render(text)
        if fresh == text:
            continue
        stale.append(page)
        if not args.check:
            path.write_text(fresh)
            print(f"wrote docs/{page}")
    if args.check and stale:
        print(f"stale: {', '.join('docs/' + p for p in stale)}: run `make docs`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
