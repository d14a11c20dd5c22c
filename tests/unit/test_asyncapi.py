"""The AsyncAPI document: committed and current, made from the services' own FastStream
applications, with replies, subject parameters and the contract schemas, and valid in
the official AsyncAPI parser."""

import json
import re
from typing import Any

import pytest
from pydantic import BaseModel

from runwire.asyncapi import HTML_PATH, JSON_PATH, render, services, validate
from runwire.contracts import (
    AbortSessionReply,
    EndTenantReply,
    ForgetTenantReply,
    Frame,
    JoinReply,
    ListReply,
    ResumeReply,
    RunReply,
    SignalReply,
    Subjects,
    SubmitCommand,
    SubmitReply,
    WebhooksReply,
)
from runwire.contracts.commands import BODIES
from runwire.contracts.events import RunEvent
from runwire.contracts.frames import Job
from runwire.contracts.health import HealthReply
from runwire.contracts.replies import (
    BudgetReply,
    PolicyReply,
    RateLimitsReply,
    ReleaseReply,
    SchedulesReply,
)
from runwire.contracts.subjects import COMMANDS

pytestmark = pytest.mark.unit

S = Subjects()
T, R = "{tenant}", "{run_id}"
SERVICES = ("submitter", "executor", "relay", "recovery")

REPLIES: dict[str, type[BaseModel]] = {
    "submit": SubmitReply,
    "release": ReleaseReply,
    "cancel": RunReply,
    "get": RunReply,
    "abort_session": AbortSessionReply,
    "end_tenant": EndTenantReply,
    "forget_tenant": ForgetTenantReply,
    "list": ListReply,
    "resume": ResumeReply,
    "signal": SignalReply,
    "reschedule": RunReply,
    "set_schedule": SchedulesReply,
    "remove_schedule": SchedulesReply,
    "list_schedules": SchedulesReply,
    "backfill_schedule": SchedulesReply,
    "set_webhooks": WebhooksReply,
    "get_webhooks": WebhooksReply,
    "resolve_effect": RunReply,
    "set_budget": BudgetReply,
    "get_budget": BudgetReply,
    "set_policy": PolicyReply,
    "get_policy": PolicyReply,
    "set_rate_limit": RateLimitsReply,
    "get_rate_limits": RateLimitsReply,
    "join": JoinReply,
}


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(JSON_PATH.read_text())
    return loaded


def _name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _payloads(doc: dict[str, Any], channel: dict[str, Any], refs: list[Any]) -> set[str]:
    found = set()
    for ref in refs:
        message_ref = channel["messages"][_name(ref["$ref"])]["$ref"]
        found.add(_name(doc["components"]["messages"][_name(message_ref)]["payload"]["$ref"]))
    return found


def _operations(doc: dict[str, Any], address: str) -> dict[str, tuple[set[str], set[str]]]:
    """Action → (request schemas, reply schemas) of the operations on a subject."""
    found = {}
    for op in doc["operations"].values():
        channel = doc["channels"][_name(op["channel"]["$ref"])]
        if channel["address"] != address:
            continue
        replies: set[str] = set()
        if "reply" in op:
            reply_channel = doc["channels"][_name(op["reply"]["channel"]["$ref"])]
            assert reply_channel["address"] is None  # the requester's inbox
            replies = _payloads(doc, reply_channel, op["reply"]["messages"])
        found[op["action"]] = (_payloads(doc, channel, op["messages"]), replies)
    return found


def test_committed_document_is_current() -> None:
    fresh = render()
    assert JSON_PATH.exists(), "docs/asyncapi.json is missing: run `make docs`"
    assert JSON_PATH.read_text() == fresh[JSON_PATH], "docs/asyncapi.json is stale: run `make docs`"
    assert HTML_PATH.read_text() == fresh[HTML_PATH], "docs/asyncapi.html is stale: run `make docs`"


def test_the_official_asyncapi_parser_finds_no_error_or_warning() -> None:
    checked = validate(JSON_PATH)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert not re.search(r"^(error|warning) ", checked.stdout, re.MULTILINE), checked.stdout
    assert "asyncapi: valid" in checked.stdout


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_is_a_request_with_its_reply(doc: dict[str, Any], name: str) -> None:
    assert _operations(doc, S.command(T, name)) == {
        "receive": ({BODIES[name].__name__}, {REPLIES[name].__name__, "ErrorReply"})
    }


def test_a_commands_description_is_its_handlers(doc: dict[str, Any]) -> None:
    # The document says what the code does: `join` replays and continues live.
    assert doc["channels"]["cmd.join"]["description"].startswith("Join a run's frames")


@pytest.mark.parametrize("service", SERVICES)
def test_every_service_answers_health(doc: dict[str, Any], service: str) -> None:
    assert _operations(doc, S.health(service)) == {
        "receive": ({"EmptyPayload"}, {HealthReply.__name__})
    }


def test_every_subscriber_and_publisher_of_the_services_is_documented(
    doc: dict[str, Any],
) -> None:
    declared = set()
    for service in services():
        broker = service.faststream
        for endpoint in (*broker.subscribers, *broker.publishers):
            declared.update(endpoint.schema())
    assert declared
    assert declared <= set(doc["channels"])


def test_every_subject_parameter_is_declared(doc: dict[str, Any]) -> None:
    for channel in doc["channels"].values():
        names = set(re.findall(r"\{(\w+)\}", channel["address"] or ""))
        assert set(channel.get("parameters", {})) == names, channel["address"]
        assert all(p["description"] for p in channel.get("parameters", {}).values())


def test_client_frame_subject_carries_the_frame_schema(doc: dict[str, Any]) -> None:
    assert _operations(doc, S.run_frames(T, R)) == {"send": ({"Frame"}, set())}
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
    ("address", "model"),
    [(S.events(T, R), RunEvent), (S.job("{runner}", R), Job), (S.frames_out(T, R), Frame)],
)
def test_what_the_services_publish_is_listed(
    doc: dict[str, Any], address: str, model: type[BaseModel]
) -> None:
    assert _operations(doc, address) == {"send": ({model.__name__}, set())}


def test_the_cancel_notice_is_an_empty_message_without_reply(doc: dict[str, Any]) -> None:
    assert _operations(doc, S.cancel_notice(R)) == {"receive": ({"EmptyPayload"}, set())}
