"""Which runners the submitter accepts runs for, and the check of a run's input.

A runner is known when this process has it (entry points, `RUNWIRE_RUNNERS`), or when
an executor has recorded that it serves it (the `runners` table, with the JSON Schema of
its input): a runner installed only beside some executors is still accepted and its
input still checked. Anything else is refused with `INVALID_REQUEST`.
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, best_match
from pydantic import ValidationError

from runwire.runners.base import RunnerSpec
from runwire.runtime.commands import describe
from runwire.runtime.errors import InvalidRequest, RunwireError
from runwire.runtime.store import Store

log = logging.getLogger(__name__)

# How old the executors' list may get before a submit reads it again; a runner not in it
# is looked up again at most this often (a new executor's runner is known that soon).
REFRESH_S = 5.0
MISS_REFRESH_S = 0.5


class RunnerCatalog:
    """The runners a submit may name, with their input checks."""

    def __init__(self, store: Store, local: Mapping[str, RunnerSpec]) -> None:
        self.store = store
        self.local = dict(local)
        self._remote: dict[str, Draft202012Validator | None] = {}
        # The JSON Schema checks of this process's runners, for node input templates.
        self._templates: dict[str, Draft202012Validator] = {}
        self._loaded_at = float("-inf")
        self._loading: asyncio.Lock = asyncio.Lock()

    def pin(self, runner: str, value: dict[str, Any]) -> str | None:
        """The fingerprint of the configuration the run must keep, when this process has
        the runner and it pins one (else its first attempt pins it)."""
        spec = self.local.get(runner)
        if spec is None or spec.pin is None:
            return None
        try:
            return spec.pin(value)
        except ValidationError as exc:  # the run's input, which its submitter may read
            raise InvalidRequest(
                f"runner {runner!r} cannot pin this run's configuration: {describe(exc)}"
            ) from exc
        except Exception as exc:
            # Its text may hold what the pin read (settings, a URL): the log has it.
            log.error("runner %r's pin raised %s", runner, type(exc).__name__, exc_info=exc)
            raise InvalidRequest(
                f"runner {runner!r} cannot pin this run's configuration "
                f"({type(exc).__name__}); the submitter logged the details"
            ) from exc

    def names(self) -> list[str]:
        return sorted(self.local.keys() | self._remote.keys())

    async def _load(self, older_than: float) -> None:
        async with self._loading:
            if time.monotonic() - self._loaded_at < older_than:
                return  # another submit has just read it
            catalog = await self.store.runner_catalog()
            remote: dict[str, Draft202012Validator | None] = {}
            for name, schema in catalog.items():
                if schema is None:
                    remote[name] = None
                    continue
                known = self._remote.get(name)
                if known is not None and known.schema == schema:
                    # Unchanged: checking a schema takes tens of milliseconds of the
                    # event loop (the openai runner's), every REFRESH_S, in every submit's
                    # way.
                    remote[name] = known
                    continue
                try:
                    Draft202012Validator.check_schema(schema)
                except SchemaError as exc:
                    log.error("runner %s: its input schema is not valid: %s", name, exc.message)
                    continue
                remote[name] = Draft202012Validator(schema)
            self._remote = remote
            self._loaded_at = time.monotonic()

    async def keep_fresh(self, stop: asyncio.Event) -> None:
        """Read the executors' runners now and every REFRESH_S until `stop` (so that
        health replies list them; a submit naming a runner not seen yet looks again)."""
        while not stop.is_set():
            try:
                await self._load(REFRESH_S / 2)
            except RunwireError as exc:
                log.warning("cannot read the executors' runners: %s", exc.message)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), REFRESH_S)

    async def require(self, runner: str, where: str = "") -> None:
        """Raise InvalidRequest unless `runner` is known (`where` starts the message)."""
        if runner in self.local:
            return
        age = time.monotonic() - self._loaded_at
        if age >= REFRESH_S or (runner not in self._remote and age >= MISS_REFRESH_S):
            await self._load(MISS_REFRESH_S if runner not in self._remote else REFRESH_S)
        if runner not in self._remote:
            known = ", ".join(self.names()) or "none"
            raise InvalidRequest(f"{where}unknown runner {runner!r}; known runners: {known}")

    async def check_template(self, runner: str, template: dict[str, Any], where: str) -> None:
        """Raise InvalidRequest (`where` starts the message) unless a workflow node's
        input `template` can fit `runner`'s input: checked against its JSON Schema, where a
        `{"$ref": ...}` stands for any value (it is known only when the node runs)."""
        spec = self.local.get(runner)
        if spec is not None:
            if spec.input_model is None:
                return
            validator = self._templates.get(runner)
            if validator is None:
                validator = self._templates[runner] = Draft202012Validator(
                    spec.input_model.model_json_schema()
                )
        else:
            await self.require(runner, where)
            validator = self._remote[runner]
            if validator is None:
                return
        errors = [
            e for e in validator.iter_errors(template) if not _by_ref(template, e.absolute_path)
        ]
        error = best_match(errors)
        if error is not None:
            path = "/".join(str(part) for part in error.absolute_path) or "input"
            raise InvalidRequest(f"{where}input for runner {runner!r}: {path}: {error.message}")

    async def check(self, runner: str, value: dict[str, Any]) -> None:
        """Raise InvalidRequest unless `runner` is known and `value` fits its input."""
        spec = self.local.get(runner)
        if spec is not None:
            if spec.input_model is not None:
                try:
                    spec.input_model.model_validate(value)
                except ValidationError as exc:
                    raise InvalidRequest(f"input for runner {runner!r}: {describe(exc)}") from exc
            return
        await self.require(runner)
        validator = self._remote[runner]
        if validator is None:
            return
        error = best_match(validator.iter_errors(value))
        if error is not None:
            where = "/".join(str(part) for part in error.absolute_path) or "input"
            raise InvalidRequest(f"input for runner {runner!r}: {where}: {error.message}")


def _by_ref(template: Any, path: Iterable[str | int]) -> bool:
    """Whether the value at `path` in `template`, or one it is part of, is a `$ref`."""
    found = template
    for part in (None, *path):
        if part is not None:
            try:
                found = found[part]
            except (KeyError, IndexError, TypeError):
                return False
        if isinstance(found, dict) and set(found) == {"$ref"}:
            return True
    return False
