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
from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from runwire.contracts.subjects import RUNNER_NAME_PATTERN
from runwire.runners.base import RunnerSpec

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "runwire.runners"
_NAME = re.compile(RUNNER_NAME_PATTERN)
_TARGET = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


class RunnerConfigError(Exception):
    """A runner that cannot be registered: bad name, import error, not a runner."""


def _check_name(name: str, where: str) -> None:
    if not _NAME.match(name):
        raise RunnerConfigError(
            f"{where}: {name!r} is not a runner name (lower-case letters, digits, '_' and "
            "'-', starting with a letter, at most 64)"
        )


def _import(target: str, where: str) -> object:
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


def parse_setting(setting: str) -> dict[str, str]:
    """`name=module:object,...` → {name: "module:object"}; a malformed entry is an error."""
    targets: dict[str, str] = {}
    for item in (part.strip() for part in setting.split(",")):
        if not item:
            continue
        name, sep, target = (piece.strip() for piece in item.partition("="))
        where = f"RUNWIRE_RUNNERS entry {item!r}"
        if not sep or not _TARGET.match(target):
            raise RunnerConfigError(f"{where}: expected name=package.module:object")
        _check_name(name, where)
        if name in targets:
            raise RunnerConfigError(f"{where}: runner {name!r} is named twice")
        targets[name] = target
    return targets


def _entry_points() -> dict[str, EntryPoint]:
    found: dict[str, EntryPoint] = {}
    for point in entry_points(group=ENTRY_POINT_GROUP):
        other = found.get(point.name)
        if other is not None and other.value != point.value:
            raise RunnerConfigError(
                f"two installed packages register the runner {point.name!r}: "
                f"{other.value!r} and {point.value!r}"
            )
        found[point.name] = point
    return found


def load_runners(
    setting: str = "", extra: Mapping[str, object] | None = None
) -> dict[str, RunnerSpec]:
    """Every runner this process has: entry points, then the setting, then `extra`
    (runners handed over in code, as the test kit does), each winning over the one before."""
    runners: dict[str, RunnerSpec] = {}
    for name, point in _entry_points().items():
        where = f"entry point {name} = {point.value!r} (group {ENTRY_POINT_GROUP})"
        _check_name(name, where)
        try:
            obj = point.load()
        except Exception as exc:
            raise RunnerConfigError(f"{where}: cannot load it: {exc}") from exc
        runners[name] = _spec(obj, where)
    for name, target in parse_setting(setting).items():
        where = f"RUNWIRE_RUNNERS runner {name} = {target!r}"
        if name in runners:
            log.info("runner %s: the setting's %s replaces the entry point", name, target)
        runners[name] = _spec(_import(target, where), where)
    for name, obj in (extra or {}).items():
        _check_name(name, f"runner {name!r}")
        runners[name] = _spec(obj, f"runner {name!r}")
    return runners


def input_schema(spec: RunnerSpec) -> dict[str, Any] | None:
    """The JSON Schema of a runner's input (what other services check runs against)."""
    return None if spec.input_model is None else spec.input_model.model_json_schema()
