"""The wire models: strict bodies, committed JSON Schemas, subject names."""

import json

import pytest
from pydantic import ValidationError

from runwire.contracts import (
    FRAME_DATA,
    DoneData,
    Frame,
    FrameType,
    RunStatus,
    Subjects,
    SubmitCommand,
    typed_data,
)
from runwire.contracts.errors import ErrorCode
from runwire.contracts.schemas import SCHEMA_DIR, render

pytestmark = pytest.mark.unit


def test_unknown_fields_are_rejected() -> None:
    with pytest.raises(ValidationError, match="extra"):
        SubmitCommand.model_validate({"request_id": "r", "input": {}, "colour": "red"})


def test_version_must_be_one() -> None:
    with pytest.raises(ValidationError):
        SubmitCommand.model_validate({"v": 2, "request_id": "r", "input": {}})
    assert SubmitCommand(request_id="r", input={}).v == 1


def test_committed_schemas_are_current() -> None:
    committed = {p.name: p.read_text() for p in SCHEMA_DIR.glob("*.json")}
    assert committed == render(), "contracts/schema is stale: run `make schemas`"


def test_frame_round_trips_with_rfc3339_utc_time() -> None:
    body = {
        "v": 1,
        "run_id": "r",
        "seq": 1,
        "type": "message",
        "data": {"text": "hi"},
        "at": "2026-01-02T03:04:05.678Z",
    }
    frame = Frame.model_validate(body)
    assert frame.type == FrameType.MESSAGE
    assert json.loads(frame.model_dump_json())["at"].endswith("Z")


def test_terminal_statuses() -> None:
    terminal = {s for s in RunStatus if s.terminal}
    assert terminal == {"finished", "failed", "canceled", "interrupted"}


def test_error_codes_are_upper_snake_and_stable() -> None:
    assert all(code.value == code.name and code.value.isupper() for code in ErrorCode)
    assert "QUEUE_FULL" in {c.value for c in ErrorCode}


def test_subjects_follow_the_prefix() -> None:
    s = Subjects("rw")
    assert s.command("acme", "submit") == "rw.acme.cmd.submit"
    assert s.run_frames("acme", "r1") == "rw.acme.runs.r1.frames"
    assert s.jobs_stream == "RW_JOBS"
    assert Subjects("t1").run_frames_stream == "T1_RUN_FRAMES"
    with pytest.raises(ValueError, match="prefix"):
        Subjects("bad.prefix")


def test_every_frame_type_has_a_data_model_and_data_must_fit_it() -> None:
    assert set(FRAME_DATA) == set(FrameType)
    at = "2026-01-02T03:04:05Z"
    done = Frame.model_validate(
        {
            "run_id": "r",
            "seq": 2,
            "type": "done",
            "data": {"status": "failed", "code": "CANCELED"},
            "at": at,
        }
    )
    assert typed_data(done.type, done.data) == DoneData(
        status=RunStatus.FAILED, code=ErrorCode.CANCELED
    )
    for type_, data in [
        ("message", {"txt": "hi"}),  # a field of another name
        ("message", {"text": 3}),  # not text
        ("done", {"status": "finished", "code": "NO_SUCH_CODE"}),
        ("run", {"attempt": 0, "resumed": False, "partial_length": 0}),  # attempts count from 1
        ("tool_call", {"name": "search"}),  # no id to pair its result with
    ]:
        with pytest.raises(ValidationError):
            Frame.model_validate({"run_id": "r", "seq": 1, "type": type_, "data": data, "at": at})
