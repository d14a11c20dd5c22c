"""Which runners a process has: found through entry points and a setting.

A runner is registered under a name, without touching runwire:

- in a package's metadata, entry-point group `runwire.runners`:
  `[project.entry-points."runwire.runners"] echo = "my_agents.echo:echo"`;
- or, for code that is not packaged, the setting `RUNWIRE_RUNNERS`:
  `echo=my_agents.echo:echo,other=my_agents.other:run` (it wins over an entry point of
  the same name).

The object is an async function taking an `AttemptContext`, or a declaration made with
`runwire.runner(input=..., max_in_flight=...)`. A name that cannot be loaded stops the
service at start with the reason: a half-registered runner would fail runs later.
"""

import importlib
import logging
import re
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any, TypeVar

from runwire.contracts.subjects import RUNNER_NAME_PATTERN
from runwire.runners.base import RunnerSpec

log = logging.getLogger(__name__)

T = TypeVar("T")

ENTRY_POINT_GROUP = "runwire.runners"
_NAMES = {
    "runner": (
        re.compile(RUNNER_NAME_PATTERN),
        "lower-case letters, digits, '_' and '-', starting with a letter, at most 64",
    ),
    # What a model provider accepts as a function's name.
    "tool": (re.compile(r"^[A-Za-z0-9_-]{1,64}$"), "letters, digits, '_' and '-', at most 64"),
}
_TARGET = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


class RunnerConfigError(Exception):
    """A runner that cannot be registered: bad name, import error, not a runner."""


def check_name(name: str, where: str, *, what: str = "runner") -> None:
    """Refuse a name that is not a valid runner (or tool) name."""
    pattern, rule = _NAMES[what]
    if not pattern.match(name):
        raise RunnerConfigError(f"{where}: {name!r} is not a {what} name ({rule})")


def import_object(target: str, where: str) -> object:
    """The object `package.module:attribute` names; any failure is a RunnerConfigError."""
    module_name, _, attribute = target.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            obj = getattr(obj, part)
    except Exception as exc:
        raise RunnerConfigError(f"{where}: cannot load {target!r}: {exc}") from exc
    return obj


def _spec(obj: object, where: str) -> RunnerSpec:
    try:
        return RunnerSpec.of(obj, where=where)
    except TypeError as exc:
        raise RunnerConfigError(str(exc)) from exc


def parse_setting(
    setting: str, variable: str = "RUNWIRE_RUNNERS", *, what: str = "runner"
) -> dict[str, str]:
    """`name=module:object,...` → {name: "module:object"}; a malformed entry is an error."""
    targets: dict[str, str] = {}
    for item in (part.strip() for part in setting.split(",")):
        if not item:
            continue
        name, sep, target = (piece.strip() for piece in item.partition("="))
        where = f"{variable} entry {item!r}"
        if not sep or not _TARGET.match(target):
            raise RunnerConfigError(f"{where}: expected name=package.module:object")
        check_name(name, where, what=what)
        if name in targets:
            raise RunnerConfigError(f"{where}: {what} {name!r} is named twice")
        targets[name] = target
    return targets


def installed(group: str, what: str = "runner") -> dict[str, str]:
    """Name → `module:object` of each entry point of `group` in the installed packages."""
    found: dict[str, str] = {}
    for point in entry_points(group=group):
        other = found.get(point.name)
        if other is not None and other != point.value:
            raise RunnerConfigError(
                f"two installed packages register the {what} {point.name!r}: "
                f"{other!r} and {point.value!r}"
            )
        found[point.name] = point.value
    return found


def load_named(
    group: str,
    convert: Callable[[object, str], T],
    *,
    what: str = "runner",
    rule: str = "runner",
    variable: str | None = None,
    setting: str = "",
    extra: Mapping[str, object] | None = None,
) -> dict[str, T]:
    """Everything registered under a name for this process: the entry points of `group`,
    then the setting `variable` (`name=module:object,...`), then `extra` (handed over in
    code, as the test kit does), each winning over the one before. `convert` turns an
    object into what is registered, or raises RunnerConfigError naming `where`."""
    found: dict[str, T] = {}
    for name, target in installed(group, what).items():
        where = f"entry point {name} = {target!r} (group {group})"
        check_name(name, where, what=rule)
        found[name] = convert(import_object(target, where), where)
    if variable is not None:
        for name, target in parse_setting(setting, variable, what=rule).items():
            if name in found:
                log.info("%s %s: %s's %s replaces the entry point", what, name, variable, target)
            where = f"{variable} {what} {name} = {target!r}"
            found[name] = convert(import_object(target, where), where)
    for name, obj in (extra or {}).items():
        check_name(name, f"{what} {name!r}", what=rule)
        found[name] = convert(obj, f"{what} {name!r}")
    return found


def load_runners(
    setting: str = "", extra: Mapping[str, object] | None = None
) -> dict[str, RunnerSpec]:
    """Every runner this process has: entry points, `RUNWIRE_RUNNERS`, then `extra`."""
    return load_named(
        ENTRY_POINT_GROUP, _spec, variable="RUNWIRE_RUNNERS", setting=setting, extra=extra
    )


def input_schema(spec: RunnerSpec) -> dict[str, Any] | None:
    """The JSON Schema of a runner's input (what other services check runs against)."""
    return None if spec.input_model is None else spec.input_model.model_json_schema()
