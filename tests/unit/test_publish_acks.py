"""What a JetStream publish acknowledgement means to a caller."""

import json

import pytest
from nats.aio.msg import Msg

from runwire.runtime.broker import _stream_seq
from runwire.runtime.errors import PayloadTooLarge, QueueFull, Unavailable

pytestmark = pytest.mark.unit


def _error(code: int, err_code: int, description: str) -> Msg:
    return _reply({"error": {"code": code, "err_code": err_code, "description": description}})


def _reply(data: object, headers: dict[str, str] | None = None) -> Msg:
    body = data if isinstance(data, bytes) else json.dumps(data).encode()
    return Msg(_client=None, subject="_INBOX.x.1", data=body, headers=headers)  # type: ignore[arg-type]


def test_an_acknowledgement_gives_the_stream_sequence() -> None:
    assert _stream_seq(_reply({"stream": "RW_JOBS", "seq": 42}), "rw.jobs.r", "RW_JOBS") == 42
    duplicate = {"stream": "RW_JOBS", "seq": 7, "duplicate": True}
    assert _stream_seq(_reply(duplicate), "rw.jobs.r", "RW_JOBS") == 7


@pytest.mark.parametrize(
    ("reply", "error", "says"),
    [
        (_error(503, 10077, "maximum messages exceeded"), QueueFull, "full"),
        (_error(400, 10054, "message size exceeds maximum"), PayloadTooLarge, "too large"),
        (_error(503, 10039, "jetstream not enabled"), Unavailable, "jetstream not enabled"),
        (_reply(b"", {"Status": "503"}), Unavailable, "no stream stores"),
        (_reply(b"not json"), Unavailable, "unreadable"),
        (_reply([1, 2]), Unavailable, "unreadable"),
    ],
)
def test_an_error_reply_fails_the_publish_with_its_meaning(
    reply: Msg, error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=says):
        _stream_seq(reply, "rw.jobs.r", "RW_JOBS")
