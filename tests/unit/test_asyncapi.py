"""The AsyncAPI document: committed and current, every subject with its contract schemas."""

import json
from typing import Any

import pytest
from pydantic import BaseModel

from contracts import (
    AbortSessionCommand,
    AbortSessionReply,
    CancelCommand,
    Frame,
    GetCommand,
    JoinCommand,
    JoinReply,
    RunReply,
    Subjects,
    SubmitCommand,
    SubmitReply,
)
from contracts.asyncapi import HTML_PATH, JSON_PATH, REPLY_INBOX, render
from contracts.events import RunEvent
from contracts.frames import Job, RawFrame
from contracts.health import HealthReply
from contracts.subjects import COMMANDS

pytestmark = pytest.mark.unit

S = Subjects()
T, R = "{tenant}", "{run_id}"

REQUESTS: dict[str, type[BaseModel]] = {
    "submit": SubmitCommand,
    "cancel": CancelCommand,
    "get": GetCommand,
    "abort_session": AbortSessionCommand,
    "join": JoinCommand,
}
REPLIES: dict[str, type[BaseModel]] = {
    "submit": SubmitReply,
    "cancel": RunReply,
    "get": RunReply,
    "abort_session": AbortSessionReply,
    "join": JoinReply,
}


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(JSON_PATH.read_text())
    return loaded


def _name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _operations(doc: dict[str, Any], address: str, about: str = "") -> dict[str, set[str]]:
    """Action (`send`/`receive`) → schema names of the messages on a subject (on its
    channels whose description mentions `about`: a reply names its command's subject)."""
    found: dict[str, set[str]] = {}
    schemas = doc["components"]["schemas"]
    for op in doc["operations"].values():
        channel = doc["channels"][_name(op["channel"]["$ref"])]
        if channel["address"] != address or about not in channel.get("description", ""):
            continue
        for ref in op["messages"]:
            message_ref = channel["messages"][_name(ref["$ref"])]["$ref"]
            payload = doc["components"]["messages"][_name(message_ref)]["payload"]
            name = _name(payload["$ref"])
            union = {_name(item["$ref"]) for item in schemas[name].get("anyOf", ())}
            found.setdefault(op["action"], set()).update(union or {name})
    return found


def test_committed_document_is_current() -> None:
    fresh = render()
    assert JSON_PATH.exists(), "docs/asyncapi.json is missing: run `make docs`"
    assert JSON_PATH.read_text() == fresh[JSON_PATH], "docs/asyncapi.json is stale: run `make docs`"
    assert HTML_PATH.read_text() == fresh[HTML_PATH], "docs/asyncapi.html is stale: run `make docs`"


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_subject_is_listed_with_its_schemas(doc: dict[str, Any], name: str) -> None:
    assert _operations(doc, S.command(T, name)) == {"receive": {REQUESTS[name].__name__}}
    replies = _operations(doc, REPLY_INBOX, about=f"`{S.command(T, name)}`")
    assert replies == {"send": {REPLIES[name].__name__, "ErrorReply"}}


def test_client_frame_subject_carries_the_frame_schema(doc: dict[str, Any]) -> None:
    assert _operations(doc, S.run_frames(T, R)) == {"send": {"Frame"}}
    frame = doc["components"]["schemas"]["Frame"]
    assert frame["required"] == Frame.model_json_schema()["required"]
    assert set(frame["properties"]) == set(Frame.model_fields)
    assert frame["additionalProperties"] is False


def test_submit_command_schema_is_the_contract_model(doc: dict[str, Any]) -> None:
    submit = doc["components"]["schemas"]["SubmitCommand"]
    expected = SubmitCommand.model_json_schema()
    assert submit["required"] == expected["required"]
    assert set(submit["properties"]) == set(SubmitCommand.model_fields)
    assert submit["properties"]["v"] == expected["properties"]["v"]


@pytest.mark.parametrize(
    ("address", "action", "model"),
    [
        (S.events(T, R), "send", RunEvent),
        (S.job(R), "receive", Job),
        (S.frames_in(T, R), "receive", RawFrame),
    ],
)
def test_other_subjects_are_listed(
    doc: dict[str, Any], address: str, action: str, model: type[BaseModel]
) -> None:
    assert _operations(doc, address) == {action: {model.__name__}}


@pytest.mark.parametrize("address", [S.health("{service}"), S.cancel_notice(R)])
def test_empty_requests_are_listed(doc: dict[str, Any], address: str) -> None:
    assert _operations(doc, address) == {"receive": {"EmptyPayload"}}


def test_health_reply_is_listed(doc: dict[str, Any]) -> None:
    about = f"`{S.health('{service}')}`"
    assert _operations(doc, REPLY_INBOX, about=about) == {"send": {HealthReply.__name__}}
