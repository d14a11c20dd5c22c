"""A thread's values as LangGraph's `MessagesState` graphs show them: the keys of the runs'
inputs, and `messages`, LangChain message dicts (the inputs' messages, then each
finished run's answer as one AI message). Also the assistants' ids: LangGraph names a
graph's assistant by a UUID made from the graph's name, and so does the gateway for a
runner."""

import uuid
from typing import Any

# LangGraph's namespace for the UUIDs of graphs' assistants (so that an assistant id
# taken from LangGraph's server for a graph names the runner of that name here).
NAMESPACE_GRAPH = uuid.UUID("6ba7b821-9dad-11d1-80b4-00c04fd430c8")
# Message types by the role names clients may send instead.
ROLES = {
    "user": "human",
    "human": "human",
    "assistant": "ai",
    "ai": "ai",
    "system": "system",
    "developer": "system",
    "tool": "tool",
}


def assistant_id(runner: str) -> str:
    """The assistant id of a runner, as LangGraph's server makes one for a graph."""
    return str(uuid.uuid5(NAMESPACE_GRAPH, runner))


def message(kind: str, content: Any, message_id: str, **extra: Any) -> dict[str, Any]:
    """A LangChain message dict of type `kind` (human, ai, system, tool)."""
    body: dict[str, Any] = {
        "content": content,
        "additional_kwargs": {},
        "response_metadata": {},
        "type": kind,
        "name": None,
        "id": message_id,
    }
    if kind == "ai":
        body.update(tool_calls=[], invalid_tool_calls=[], usage_metadata=None)
    body.update(extra)
    return body


def answer_id(run_id: str) -> str:
    """The id of a run's answer message (LangGraph names a model call's `lc_run--...`)."""
    return f"lc_run--{run_id}"


def answer(run_id: str, text: str) -> dict[str, Any]:
    """A run's answer: its text as one AI message."""
    return message("ai", text, answer_id(run_id))


def chunk(run_id: str, delta: str, *, last: bool = False) -> dict[str, Any]:
    """One text delta of a run's answer, as LangChain's AIMessageChunk."""
    return message(
        "AIMessageChunk",
        delta,
        answer_id(run_id),
        tool_calls=[],
        invalid_tool_calls=[],
        usage_metadata=None,
        tool_call_chunks=[],
        chunk_position="last" if last else None,
    )


def input_messages(given: Any) -> list[dict[str, Any]]:
    """The `messages` of a run's input as LangChain message dicts, each with an id (a
    string is one human message). ValueError names what is wrong."""
    if given is None:
        return []
    items = given if isinstance(given, list) else [given]
    found = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            item = {"type": "human", "content": item}
        if not isinstance(item, dict):
            raise ValueError(f"messages[{i}]: a message object or a string")
        kind = ROLES.get(str(item.get("type") or item.get("role") or ""))
        if kind is None:
            raise ValueError(f"messages[{i}]: type (or role) one of {', '.join(sorted(ROLES))}")
        if "content" not in item:
            raise ValueError(f"messages[{i}]: content is required")
        extra = {
            k: v
            for k, v in item.items()
            if k in ("additional_kwargs", "response_metadata", "name", "tool_call_id")
        }
        if kind == "tool" and "tool_call_id" not in extra:
            raise ValueError(f"messages[{i}]: a tool message needs tool_call_id")
        found.append(message(kind, item["content"], str(item.get("id") or uuid.uuid4()), **extra))
    return found


def split_input(given: dict[str, Any] | None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A run's input as (the keys it sets, the messages it adds)."""
    given = dict(given or {})
    return given, input_messages(given.pop("messages", None))


def add_messages(messages: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` with `new` added: one with the id of a message already there replaces
    it (as LangGraph's `add_messages` does)."""
    merged = list(messages)
    at = {m.get("id"): i for i, m in enumerate(merged)}
    for m in new:
        if m.get("id") in at:
            merged[at[m["id"]]] = m
        else:
            at[m.get("id")] = len(merged)
            merged.append(m)
    return merged


def applied(values: dict[str, Any] | None, entry: dict[str, Any]) -> dict[str, Any]:
    """The values once the run `entry` (a thread's record of it) has taken its input."""
    base = dict(values or {})
    messages = base.pop("messages", [])
    return {
        **base,
        **entry.get("state", {}),
        "messages": add_messages(messages, entry.get("messages", [])),
    }


def answered(values: dict[str, Any], run_id: str, text: str) -> dict[str, Any]:
    """The values once the run has answered `text`."""
    return {**values, "messages": add_messages(values.get("messages", []), [answer(run_id, text)])}
