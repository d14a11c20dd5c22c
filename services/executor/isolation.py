"""Runners in a process of their own, with only their run's rights.

A runner named in `RUNWIRE_ISOLATED_RUNNERS` does not run inside the executor: each of
its attempts starts `python -m runwire.executor.runner_process`, which loads the runner
(and the tools) the way the executor does and runs it on a proxy of the attempt's
context. Everything the runner does goes through the executor, over a socket pair, one
JSON line a message, and only for its own run: frames (`emit`, `message`, tool calls),
`checkpoint`, `effect`, `reserve`, `settle`, rate limits (`take_rate`, `settle_rate`,
`observe_rate`) and waits (`interrupt`, `wait_for_signal`).
The process is given none of the executor's credentials (no database URL, no NATS
identity: WITHHELD), so a runner that runs a tenant's code cannot read other tenants'
runs or publish for other runs. The attempt's abort (cancel, deadline, shutdown) is
passed on; a process that does not stop within the abort grace is killed, as one that
outlives its attempt is.

Messages, executor to runner: `{"start": {...}}` once, the answer to each call
(`{"id", "ok": value}` or `{"id", "error": {...}}`), `{"abort": true}`. Runner to
executor: `{"id", "call": name, "args": {...}}`, and at the end `{"end": {"result": ...}}`,
`{"end": {"error": {code, message, retryable, retry_after_s}}}` (a RunnerError),
`{"end": {"closed": true}}` or `{"end": {"crashed": "<exception class>"}}`.
"""

import asyncio
import contextlib
import json
import logging
import os
import socket
import sys
from collections.abc import Mapping
from typing import Any

from runwire.contracts.errors import ErrorCode
from runwire.contracts.frames import FrameType, WaitKind
from runwire.runners.base import AttemptClosed, AttemptContext, RunnerError, WaitTimeout

log = logging.getLogger(__name__)

# The executor's credentials and where its servers are: a runner's process gets none.
WITHHELD = (
    "RUNWIRE_DATABASE_URL",
    "RUNWIRE_NATS_URL",
    "RUNWIRE_NATS_USER",
    "RUNWIRE_NATS_PASSWORD",
    "RUNWIRE_ENV_FILE",
    "DATABASE_URL",
    "PGHOST",
    "PGUSER",
    "PGPASSWORD",
    "PGPASSFILE",
    "PGSERVICEFILE",
)
# The longest message line (a resumed attempt's history rides in `start`).
LINE_LIMIT = 256 * 1024 * 1024
# How long a runner's process has to exit once its attempt is over, before it is killed.
EXIT_GRACE_S = 2.0
CHILD_MODULE = "runwire.executor.runner_process"


def isolated(setting: str, name: str) -> bool:
    """Whether runner `name` runs in a process of its own (`setting`: names, or `*`)."""
    names = {item.strip() for item in setting.split(",") if item.strip()}
    return "*" in names or name in names


def child_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of a runner's process: the executor's, without its credentials."""
    return {key: value for key, value in environ.items() if key not in WITHHELD}


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def runner_error_body(exc: RunnerError) -> dict[str, Any]:
    return {
        "code": str(exc.code),
        "message": exc.message,
        "retryable": exc.retryable,
        "retry_after_s": exc.retry_after_s,
    }


def runner_error(body: Mapping[str, Any]) -> RunnerError:
    if body["code"] == ErrorCode.WAIT_TIMEOUT:
        return WaitTimeout(str(body["message"]))
    return RunnerError(
        str(body["message"]),
        retryable=bool(body["retryable"]),
        retry_after_s=body.get("retry_after_s"),
        code=ErrorCode(body["code"]),
    )


class IsolatedRunner:
    """Runner `name`, run in a process of its own for each attempt (see the module)."""

    def __init__(self, name: str, *, runners: str, tools: str) -> None:
        self.name = name
        self._runners = runners
        self._tools = tools

    async def __call__(self, ctx: AttemptContext) -> dict[str, Any] | None:
        ours, theirs = socket.socketpair()
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                CHILD_MODULE,
                str(theirs.fileno()),
                pass_fds=(theirs.fileno(),),
                env=child_environment(os.environ),
                stdin=asyncio.subprocess.DEVNULL,
            )
        finally:
            theirs.close()
        reader, writer = await asyncio.open_connection(sock=ours, limit=LINE_LIMIT)
        aborting = asyncio.create_task(self._pass_abort(ctx, writer))
        try:
            writer.write(encode({"start": self._start(ctx)}))
            await writer.drain()
            return await self._serve(ctx, reader, writer, proc)
        finally:
            aborting.cancel()
            writer.close()
            await self._reap(proc)

    def _start(self, ctx: AttemptContext) -> dict[str, Any]:
        return {
            "runner": self.name,
            "runners": self._runners,
            "tools": self._tools,
            "run_id": ctx.run_id,
            "tenant": ctx.tenant,
            "input": ctx.input,
            "attempt": ctx.attempt,
            "resumed": ctx.resumed,
            "continuation": ctx.continuation,
            "checkpoint_state": ctx.checkpoint_state,
            "history": [frame.model_dump(mode="json") for frame in ctx.history],
            "durable_sleep_s": ctx.durable_sleep_s,
        }

    async def _pass_abort(self, ctx: AttemptContext, writer: asyncio.StreamWriter) -> None:
        await ctx.abort.wait()
        with contextlib.suppress(ConnectionError, RuntimeError):
            writer.write(encode({"abort": True}))
            await writer.drain()

    async def _serve(
        self,
        ctx: AttemptContext,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        proc: asyncio.subprocess.Process,
    ) -> dict[str, Any] | None:
        """Answer the runner's calls, in order, until it ends."""
        while line := await reader.readline():
            message = json.loads(line)
            if "end" in message:
                return self._ended(message["end"])
            answer: dict[str, Any] = {"id": message["id"]}
            try:
                answer["ok"] = await self._call(ctx, message["call"], message["args"])
            except RunnerError as exc:
                answer["error"] = {"runner": runner_error_body(exc)}
            except AttemptClosed:
                answer["error"] = {"closed": True}
            writer.write(encode(answer))
            await writer.drain()
        code = await proc.wait()
        raise RunnerError(
            f"the runner's process exited ({code}) before its attempt ended", retryable=True
        )

    async def _call(self, ctx: AttemptContext, name: str, args: dict[str, Any]) -> Any:
        if name == "emit":
            await ctx.emit(FrameType(args["type"]), args["data"])
            return None
        if name == "checkpoint":
            await ctx.checkpoint(args["state"])
            return None
        if name == "effect":
            return await ctx.effect(
                args["kind"], args["key"], args["request"], tokens=args["tokens"], cost=args["cost"]
            )
        if name == "reserve":
            await ctx.reserve(args["key"], args["tokens"], cost=args["cost"])
            return None
        if name == "wait":
            if args["kind"] == WaitKind.SLEEP:
                await ctx.sleep(args["timeout"], key=args["key"])
                return None
            if args["kind"] == WaitKind.SIGNAL:
                return await ctx.wait_for_signal(
                    args["name"], timeout=args["timeout"], key=args["key"]
                )
            return await ctx.interrupt(args["payload"], timeout=args["timeout"], key=args["key"])
        if name == "take_rate":
            return await ctx.take_rate(args["limits"], args["name"], args["tokens"])
        if name == "settle_rate":
            await ctx.settle_rate(args["name"], args["tokens"])
            return None
        if name == "observe_rate":
            await ctx.observe_rate(args["limits"], **args["said"])
            return None
        if name == "settle":
            await ctx.settle(args["key"], args["tokens"], args["receipt"], cost=args["cost"])
            return None
        raise RunnerError(f"a runner's process asked for {name!r}", retryable=False)

    def _ended(self, end: dict[str, Any]) -> dict[str, Any] | None:
        if "error" in end:
            raise runner_error(end["error"])
        if end.get("closed"):
            raise AttemptClosed()
        if "crashed" in end:
            raise RunnerError(
                f"the runner failed unexpectedly ({end['crashed']}); the executor logged the "
                "details with the run_id",
                retryable=True,
            )
        result: dict[str, Any] | None = end.get("result")
        return result

    async def _reap(self, proc: asyncio.subprocess.Process) -> None:
        """Wait for the runner's process to exit; kill it if it does not soon."""
        for stop, wait in ((None, EXIT_GRACE_S), (proc.terminate, EXIT_GRACE_S), (proc.kill, None)):
            if proc.returncode is not None:
                return
            if stop is not None:
                with contextlib.suppress(ProcessLookupError):
                    stop()
            try:
                await asyncio.wait_for(proc.wait(), wait)
            except TimeoutError:
                log.warning("a runner's process did not exit; stopping it")
