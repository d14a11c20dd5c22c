"""The `openai` runner's conversation, rebuilt from a run's stored frames: each step
that called tools (its text, its calls, their results) and the text of the step under
way, so a resumed attempt (after a crash, a retry or a wait) sends the model the same
conversation and calls no tool again."""

import json
from dataclasses import dataclass, field
from typing import Any

from runwire.contracts.frames import Frame, FrameType


def assistant_message(text: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message of a step that called tools."""
    return {
        "role": "assistant",
        "content": text or None,
        "tool_calls": [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
            }
            for c in calls
        ],
    }


@dataclass
class Resumed:
    """What earlier attempts of a run did, rebuilt from its stored frames."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    # Calls made whose results are not stored.
    unanswered: list[dict[str, Any]] = field(default_factory=list)
    # Text of the step under way when the attempt before stopped.
    partial: str = ""


def resume_conversation(history: list[Frame]) -> Resumed:
    """The conversation so far, from the run's stored frames: each step that called tools
    (its text, its calls, their results), then the text of the step under way. A resumed
    attempt's cut (`resume_after`) drops the frames after it, as a client does."""
    kept: list[Frame] = []
    for frame in history:
        if frame.type == FrameType.RUN and frame.data.get("resumed"):
            after = frame.data.get("resume_after")
            if after is not None:
                kept = [f for f in kept if f.seq <= int(after)]
        elif frame.type in (FrameType.MESSAGE, FrameType.TOOL_CALL, FrameType.TOOL_RESULT):
            kept.append(frame)
    resumed = Resumed()
    text = ""
    calls: list[dict[str, Any]] = []
    answered: set[str] = set()
    for frame in kept:
        if frame.type == FrameType.MESSAGE:
            if calls:  # a new step begins after the results of the one before
                resumed.unanswered = [c for c in calls if c["id"] not in answered]
                calls, text = [], ""
            text += str(frame.data.get("text", ""))
        elif frame.type == FrameType.TOOL_CALL:
            if not calls or any(c["id"] in answered for c in calls):
                if calls:
                    calls, text = [], ""
                resumed.messages.append(assistant_message(text, []))
            call = {
                "id": frame.data["id"],
                "name": frame.data["name"],
                "arguments": frame.data.get("arguments", {}),
            }
            calls.append(call)
            resumed.messages[-1] = assistant_message(text, calls)
        else:
            answered.add(str(frame.data["id"]))
            output = frame.data.get("output")
            error = frame.data.get("error")
            resumed.messages.append(
                {
                    "role": "tool",
                    "tool_call_id": frame.data["id"],
                    "content": json.dumps({"error": error} if error is not None else output),
                }
            )
    if calls:
        resumed.unanswered = [c for c in calls if c["id"] not in answered]
    else:
        resumed.partial = text
    return resumed
