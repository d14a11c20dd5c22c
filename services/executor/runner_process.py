"""One attempt of a runner, in a process of its own (`runwire.executor.isolation`).

Started by the executor as `python -m runwire.executor.runner_process FD`, with one end of
a socket pair as file descriptor FD and none of the executor's credentials. It loads the
runners and tools as the executor does, runs the named runner on an `AttemptContext`
whose every action is a call to the executor, and says how it ended.
"""

import asyncio
import itertools
import json
import logging
import socket
import sys
from typing import Any

from runwire.contracts.frames import CHECKED, Frame, FrameType, WaitKind
from runwire.executor.isolation import LINE_LIMIT, encode, runner_error, runner_error_body
from runwire.runners.base import AbortSignal, AttemptClosed, AttemptContext, RunnerError
from runwire.runners.registry import load_runners
from runwire.runners.tools import load_tools
from runwire.runtime.logs import bind, setup

log = logging.getLogger("runwire.runner_process")

# Frames of the run's history were checked when they were made.
STORED = {CHECKED: True}


class Executor:
    """The executor, as the runner's process sees it: calls answered in turn, and the
    attempt's abort."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self.abort = AbortSignal()
        self.gone = False

    async def listen(self) -> None:
        """Take the executor's answers and its abort until it closes the socket."""
        while line := await self._reader.readline():
            message = json.loads(line)
            if message.get("abort"):
                self.abort.set()
                continue
            future = self._waiting.pop(message["id"], None)
            if future is None or future.done():
                continue
            error = message.get("error")
            if error is None:
                future.set_result(message.get("ok"))
            elif "runner" in error:
                future.set_exception(runner_error(error["runner"]))
            else:
                future.set_exception(AttemptClosed())
        # The executor is gone (its attempt is over): nothing the runner does counts now.
        self.gone = True
        self.abort.set()
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(AttemptClosed())
        self._waiting.clear()

    async def call(self, call: str, **args: Any) -> Any:
        if self.gone:
            raise AttemptClosed()
        call_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[call_id] = future
        await self.send({"id": call_id, "call": call, "args": args})
        return await future

    async def send(self, message: dict[str, Any]) -> None:
        self._writer.write(encode(message))
        await self._writer.drain()


def _context(start: dict[str, Any], executor: Executor, tools: Any) -> AttemptContext:
    async def emit(type: FrameType, data: dict[str, Any]) -> None:
        await executor.call("emit", type=str(type), data=data)

    async def checkpoint(state: Any) -> None:
        await executor.call("checkpoint", state=state)

    async def effect(
        kind: str, key: str, request: dict[str, Any], *, tokens: int = 0, cost: int = 0
    ) -> dict[str, Any]:
        receipt: dict[str, Any] = await executor.call(
            "effect", kind=kind, key=key, request=request, tokens=tokens, cost=cost
        )
        return receipt

    async def reserve(key: str, tokens: int, cost: int) -> None:
        await executor.call("reserve", key=key, tokens=tokens, cost=cost)

    async def settle(key: str, tokens: int, receipt: str | None, cost: int) -> None:
        await executor.call("settle", key=key, tokens=tokens, receipt=receipt, cost=cost)

    async def take_rate(limits: list[str], call: str, tokens: int) -> bool:
        return bool(await executor.call("take_rate", limits=limits, name=call, tokens=tokens))

    async def settle_rate(call: str, tokens: int) -> None:
        await executor.call("settle_rate", name=call, tokens=tokens)

    async def observe_rate(limits: list[str], said: dict[str, float]) -> None:
        await executor.call("observe_rate", limits=limits, said=said)

    async def wait(
        kind: WaitKind, name: str | None, payload: Any, timeout: float | None, key: str | None
    ) -> Any:
        return await executor.call(
            "wait", kind=str(kind), name=name, payload=payload, timeout=timeout, key=key
        )

    return AttemptContext(
        run_id=start["run_id"],
        tenant=start["tenant"],
        input=start["input"],
        attempt=start["attempt"],
        resumed=start["resumed"],
        continuation=start["continuation"],
        checkpoint_state=start["checkpoint_state"],
        history=[Frame.model_validate(frame, context=STORED) for frame in start["history"]],
        abort=executor.abort,
        _emit=emit,
        _checkpoint=checkpoint,
        tools=tools,
        _effect=effect,
        _reserve=reserve,
        _settle=settle,
        _wait=wait,
        durable_sleep_s=start.get("durable_sleep_s"),
        _take_rate=take_rate,
        _settle_rate=settle_rate,
        _observe_rate=observe_rate,
    )


async def attempt(fd: int) -> None:
    """Run the attempt the executor sends on socket `fd`."""
    reader, writer = await asyncio.open_connection(sock=socket.socket(fileno=fd), limit=LINE_LIMIT)
    executor = Executor(reader, writer)
    start = json.loads(await reader.readline())["start"]
    listening = asyncio.create_task(executor.listen())
    end: dict[str, Any]
    with bind(run_id=start["run_id"], attempt=start["attempt"]):
        try:
            runners = load_runners(start["runners"])
            spec = runners.get(start["runner"])
            if spec is None:
                raise RunnerError(
                    f"runner {start['runner']!r} cannot be loaded in a process of its own (it "
                    "must be an entry point or in RUNWIRE_RUNNERS)",
                    retryable=False,
                )
            ctx = _context(start, executor, load_tools(start["tools"]))
            end = {"result": await spec(ctx)}
        except RunnerError as exc:
            end = {"error": runner_error_body(exc)}
        except AttemptClosed:
            end = {"closed": True}
        except Exception as exc:
            log.error("runner raised %s", type(exc).__name__, exc_info=exc)
            end = {"crashed": type(exc).__name__}
        if not executor.gone:
            try:
                await executor.send({"end": end})
            except (TypeError, ValueError) as exc:  # a result that is not JSON
                log.error("runner's result cannot be sent: %s", type(exc).__name__)
                await executor.send({"end": {"crashed": type(exc).__name__}})
    listening.cancel()
    writer.close()


def main() -> None:
    setup("runner")
    asyncio.run(attempt(int(sys.argv[1])))


if __name__ == "__main__":
    main()
