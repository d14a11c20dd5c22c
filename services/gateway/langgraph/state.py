"""A LangGraph thread as its runs make it: status, values, interrupts and error, folded
from the thread's runs in order (gateway/lgvalues.py says how a run changes the values).
Runs that ended are settled into the thread's kept values, so a thread is read with one
`get` per run not yet settled."""

import uuid
from dataclasses import dataclass, field
from typing import Any

import runwire.gateway.langgraph.values as lgvalues
from runwire.client.sdk import Client, ClientError
from runwire.contracts.errors import ErrorCode
from runwire.contracts.frames import FrameType, Transcript
from runwire.contracts.replies import RunSummary
from runwire.contracts.status import RunStatus
from runwire.gateway.langgraph.stream import error_of, interrupt_of
from runwire.gateway.threads import Threads

# How many runs of a thread the gateway remembers the assistant and metadata of, and how
# many rolled-back runs it answers 404 for.
KEPT_RUNS = 200
CANCELED_ERROR = {"error": "UserInterrupt", "message": "the run was canceled"}


@dataclass
class View:
    """What a thread shows: LangGraph's status, values, interrupts and error."""

    status: str = "idle"
    values: dict[str, Any] | None = None
    interrupts: dict[str, Any] = field(default_factory=dict)
    error: dict[str, Any] | None = None
    # The run a waiting thread waits in, and what it asks.
    waiting: RunSummary | None = None


def task_id(run: RunSummary) -> str:
    """The id of the task a waiting run stands for (LangGraph keys a thread's interrupts
    by the task that asked)."""
    wait_id = run.waiting_for.wait_id if run.waiting_for else ""
    return str(uuid.uuid5(lgvalues.NAMESPACE_GRAPH, f"{run.run_id}:{wait_id}"))


async def run_text(client: Client, run_id: str) -> str:
    """The text of a run that ended."""
    transcript = Transcript()
    async for frame in client.stream(run_id, 0):
        transcript.apply(frame)
        if frame.type == FrameType.DONE:
            break
    return transcript.text


def entry(
    run_id: str, assistant: str, given: dict[str, Any] | None, metadata: dict[str, Any]
) -> dict[str, Any]:
    """A thread's record of one run: what its input adds to the values."""
    state, messages = lgvalues.split_input(given)
    return {
        "run_id": run_id,
        "assistant": assistant,
        "state": state,
        "messages": messages,
        "metadata": metadata,
    }


async def _fold(client: Client, thread: dict[str, Any]) -> tuple[View, int, dict[str, Any]]:
    """The thread's view, how many of its runs ended (in order, from the first), and
    the values and end of those."""
    view = View(values=thread.get("values"), **thread.get("ended", {}))
    settled, kept = 0, {"values": view.values, "ended": thread.get("ended", {})}
    for i, run_entry in enumerate(thread.get("runs", [])):
        try:
            run = await client.get(run_entry["run_id"])
        except ClientError as exc:
            if exc.code != ErrorCode.NOT_FOUND:
                raise
            if settled == i:
                settled = i + 1
            continue
        if run.status == RunStatus.QUEUED:
            view.status = "busy"
            break
        view.values = lgvalues.applied(view.values, run_entry)
        if not run.status.terminal:
            interrupt = interrupt_of(run)
            view.status, view.error = ("interrupted" if interrupt else "busy"), None
            if interrupt is not None:
                view.interrupts, view.waiting = {task_id(run): interrupt}, run
            break
        if run.status == RunStatus.FINISHED:
            text = await run_text(client, run.run_id)
            view.values = lgvalues.answered(view.values, run.run_id, text)
            view.status, view.error = "idle", None
        elif run.status == RunStatus.CANCELED:
            view.status, view.error = "interrupted", CANCELED_ERROR
        else:
            view.status, view.error = "error", error_of(run)
        settled = i + 1
        kept = {"values": view.values, "ended": {"status": view.status, "error": view.error}}
    return view, settled, kept


async def view_of(
    client: Client, threads: Threads, thread: dict[str, Any]
) -> tuple[View, dict[str, Any]]:
    """The thread's view, and the thread with its ended runs settled (kept so when no
    other change came first)."""
    view, settled, kept = await _fold(client, thread)
    if settled == 0:
        return view, thread
    done = {e["run_id"] for e in thread["runs"][:settled]}

    def settle(now: dict[str, Any]) -> dict[str, Any] | None:
        if not now.get("runs") or now["runs"][0]["run_id"] not in done:
            return None
        left = [e for e in now["runs"] if e["run_id"] not in done]
        return {**now, **kept, "runs": left}

    changed = await threads.change(client.tenant, thread["thread_id"], settle)
    return view, changed or thread


async def values_before(
    client: Client, threads: Threads, tenant: str, thread_id: str, run_id: str
) -> dict[str, Any]:
    """The thread's values as its run `run_id` starts, with that run's input taken (the
    runs before it have ended by then)."""
    thread = await threads.get(tenant, thread_id)
    if thread is None:
        return {}
    _, thread = await view_of(client, threads, thread)
    values: dict[str, Any] | None = thread.get("values")
    for run_entry in thread.get("runs", []):
        values = lgvalues.applied(values, run_entry)
        if run_entry["run_id"] == run_id:
            return values
    # Settled already (a stream read again after its run ended): the kept values, up
    # to the run's own answer.
    found = dict(values or {})
    messages = found.get("messages", [])
    ids = [m.get("id") for m in messages]
    answer = lgvalues.answer_id(run_id)
    if answer in ids:
        found["messages"] = messages[: ids.index(answer)]
    return found


def known(thread: dict[str, Any], run_id: str) -> dict[str, Any]:
    """What the thread remembers of its run: assistant, metadata, multitask strategy."""
    found: dict[str, Any] = thread.get("known", {}).get(run_id, {})
    return found


def ran(thread: dict[str, Any], run_entry: dict[str, Any], strategy: str) -> dict[str, Any]:
    """The thread with its new run."""
    remembered = dict(thread.get("known", {}))
    remembered[run_entry["run_id"]] = {
        "assistant": run_entry["assistant"],
        "metadata": run_entry["metadata"],
        "strategy": strategy,
        "modes": run_entry.get("modes"),
    }
    while len(remembered) > KEPT_RUNS:
        remembered.pop(next(iter(remembered)))
    metadata = {
        **thread.get("metadata", {}),
        "graph_id": run_entry["assistant"],
        "assistant_id": lgvalues.assistant_id(run_entry["assistant"]),
    }
    return {
        **thread,
        "metadata": metadata,
        "runs": [*thread.get("runs", []), run_entry],
        "known": remembered,
    }


def rolled_back(thread: dict[str, Any], run_ids: set[str]) -> dict[str, Any]:
    """The thread without the runs `run_ids` (a rollback deletes them)."""
    deleted = [*thread.get("deleted", []), *sorted(run_ids)][-KEPT_RUNS:]
    runs = [e for e in thread.get("runs", []) if e["run_id"] not in run_ids]
    return {**thread, "runs": runs, "deleted": deleted}
