"""The wire contract from another language: the official NATS JavaScript client submits
a run, reads its frames from the stream and subject the submit reply names (no stream
name known in advance), and finds `last_seq` final, equal to `done`'s seq, once the run
says `frames_complete`; and the official LangGraph JavaScript client against the
gateway."""

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.gateway import serve_gateway
from tests.nodejs import NODE_DIR, install_node_modules
from tests.services import InProcessStack

pytestmark = pytest.mark.integration

TOKENS = ["Grüße ", "from ", "🚀 ", "JavaScript"]


async def _follow(stack: InProcessStack, *args: str) -> dict[str, Any]:
    await asyncio.to_thread(install_node_modules)
    node = await asyncio.create_subprocess_exec(
        "node",
        "follow_run.mjs",
        stack.nats_url,
        stack.prefix,
        stack.client.tenant,
        *args,
        cwd=NODE_DIR,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(node.communicate(), 60)
    assert node.returncode == 0, err.decode()
    seen: dict[str, Any] = json.loads(out)
    return seen


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
async def test_a_javascript_client_follows_a_run_from_the_submit_reply(
    stack: InProcessStack,
) -> None:
    seen = await _follow(stack, json.dumps(TOKENS))

    assert seen["stream"] == stack.client.subjects.run_frames_stream
    assert seen["text"] == "".join(TOKENS)
    assert seen["seqs"] == list(range(1, len(seen["seqs"]) + 1))
    assert (seen["done_status"], seen["status"]) == ("finished", "finished")
    assert seen["frames_complete"] is True
    assert seen["last_seq"] == seen["done_seq"] == len(seen["seqs"])


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
async def test_a_javascript_client_keeps_a_resumed_runs_text_exact_after_emoji(
    stack: InProcessStack,
) -> None:
    # The first attempt fails after "🚀 " (two UTF-16 units, one code point); the second
    # resumes after it. The cut is by seq, so no unit of length can go wrong.
    fail = [{"attempt": 1, "after_tokens": 3, "kind": "retryable"}]
    seen = await _follow(stack, json.dumps(TOKENS), json.dumps(fail))

    assert seen["attempts"] == 2
    assert seen["text"] == "".join(TOKENS)
    # What a client slicing its JavaScript string by `partial_length` would have shown.
    assert seen["sliced_by_partial_length"] != "".join(TOKENS)


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
@pytest.mark.stack(coalesce_text=False)  # one frame per delta, as the test counts them
async def test_the_langgraph_javascript_client_streams_waits_and_conflicts(
    stack: InProcessStack, tmp_path: Path
) -> None:
    await asyncio.to_thread(install_node_modules)
    key = "rw_test-javascript-key"
    async with serve_gateway(stack.nats_url, stack.prefix, {key: "default"}, tmp_path) as url:
        node = await asyncio.create_subprocess_exec(
            "node",
            "langgraph_stream.mjs",
            url,
            key,
            cwd=NODE_DIR,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(node.communicate(), 90)
    assert node.returncode == 0, err.decode()
    seen = json.loads(out)
    assert seen["events"][0] == "metadata"
    assert seen["chunks"] == ["Grüße ", "aus ", "JavaScript", ""]
    assert seen["events"][-1] == "values"
    assert seen["run"] == "success"
    assert [m["content"] for m in seen["waited"]["messages"]] == ["waited"]
    assert seen["conflict"] == 409
    assert seen["canceled"] == "interrupted"
