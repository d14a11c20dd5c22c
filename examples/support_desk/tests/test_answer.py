"""The support agent on a real runwire stack: runwire's pytest plugin gives
`runwire_client`, a client of the four services with this package's runner and tool."""

import pytest

import runwire
from runwire.contracts.errors import ErrorCode
from runwire.contracts.frames import FrameType
from runwire.testing import collect


async def test_a_question_about_an_order_is_answered_with_the_lookup(
    runwire_client: runwire.Client,
) -> None:
    reply = await runwire_client.submit(
        {"question": "Where is order 1042?"}, runner="support-answer"
    )
    frames, transcript = await collect(runwire_client, reply.run.run_id)

    assert transcript.text == "Order 1042 is shipped, with DHL."
    call = next(f for f in frames if f.type == FrameType.TOOL_CALL)
    result = next(f for f in frames if f.type == FrameType.TOOL_RESULT)
    assert call.data["name"] == "lookup_order"
    assert call.data["arguments"] == {"order_id": "1042"}
    assert result.data["output"]["status"] == "shipped"
    assert result.data["id"] == call.data["id"]


async def test_an_unknown_order_is_said_so(runwire_client: runwire.Client) -> None:
    reply = await runwire_client.submit({"question": "And order 7?"}, runner="support-answer")
    frames, transcript = await collect(runwire_client, reply.run.run_id)

    assert transcript.text == "Sorry, I could not find that order: there is no order 7."
    result = next(f for f in frames if f.type == FrameType.TOOL_RESULT)
    assert result.data["error"] == "there is no order 7"


async def test_a_run_without_a_question_is_refused(runwire_client: runwire.Client) -> None:
    with pytest.raises(runwire.ClientError) as refused:
        await runwire_client.submit({"text": "hi"}, runner="support-answer")
    assert refused.value.code == ErrorCode.INVALID_REQUEST
    assert "question" in refused.value.message
