"""kill -9 of an executor while the model streams: the next attempt sends the model the
text the relay stored as the start of its answer, and the user's transcript is exact."""

from pathlib import Path

import pytest

from runwire.contracts.frames import FrameType
from runwire.contracts.status import RunStatus
from runwire.runners.openai_chat import RESUME_INSTRUCTION
from runwire.testing.waiting import eventually
from tests.openai_server import OpenAIServer, Request, Stream, text_answer
from tests.services import ProcessStack, assert_well_formed, collect

pytestmark = pytest.mark.chaos

WORDS = [f"w{i} " for i in range(150)]
FULL = "".join(WORDS)
HELLO = {"model": "test-model", "messages": [{"role": "user", "content": "Count"}]}


def _rest(request: Request) -> Stream:
    """Answer a resumed request with the words after the text it continues."""
    assistant, instruction = request.body["messages"][-2:]
    assert instruction == {"role": "system", "content": RESUME_INSTRUCTION}
    said = assistant["content"]
    assert FULL.startswith(said)
    return Stream(text_answer(FULL[len(said) :]))


async def test_a_killed_executor_mid_stream_resumes_the_model_from_what_was_stored(
    service_env: dict[str, str], tmp_path: Path
) -> None:
    async with OpenAIServer() as server:
        server.queue(Stream(text_answer(*WORDS), delay_s=0.02), _rest)
        # The submitter pins the base URL, so every service gets the same settings.
        env = {**service_env, "RUNWIRE_OPENAI_BASE_URL": server.base_url}
        stack = ProcessStack(env, tmp_path)
        for name in ("submitter", "relay", "recovery"):
            stack.start(name)
        victim = stack.start("executor-a")
        try:
            await stack.open()
            reply = await stack.client.submit(HELLO, runner="openai")
            run_id = reply.run.run_id

            async def streaming() -> bool:
                row = await stack.store.get_run_by_id(run_id)
                return bool(row and row.last_seq >= 40)

            await eventually(streaming, timeout=30)
            victim.kill()
            row = await stack.store.get_run_by_id(run_id)
            assert row is not None
            stored_at_kill = row.last_seq
            stack.start("executor-b")
            frames, transcript = await collect(stack.client, run_id, timeout=60)
            run = await stack.client.get(run_id)
        finally:
            await stack.close()
    first, resumed_request = server.requests

    assert_well_formed(frames)
    assert transcript.text == FULL
    assert (run.status, run.attempts) == (RunStatus.FINISHED, 2)
    resumed = next(f for f in frames if f.type == FrameType.RUN and f.data["resumed"])
    # Everything stored when the executor died is kept; only what the relay had
    # published but not yet written may be taken back.
    assert resumed.data["resume_after"] >= stored_at_kill
    kept = "".join(
        f.data["text"]
        for f in frames
        if f.type == FrameType.MESSAGE and f.seq <= resumed.data["resume_after"]
    )
    assert resumed_request.body["messages"][-2]["content"] == kept
    assert resumed.data["partial_length"] == len(kept)
    assert len(kept) >= len("".join(WORDS[:38]))
    assert first.body["messages"] == HELLO["messages"]
