"""Raw frames forged by anyone who can publish to NATS change nothing a client sees: not
with the message id a real frame will have, not for the next generation, not ahead of a
queued run, not a `done` before the real one."""

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from runwire.contracts.frames import FrameType
from runwire.contracts.status import RunStatus
from tests.services import InProcessStack, collect, eventually

pytestmark = pytest.mark.integration

SLOW = {"tokens": [f"t{i} " for i in range(12)], "token_delay_ms": 60}
REAL_TEXT = "".join(SLOW["tokens"])


async def _forge(
    stack: InProcessStack, run_id: str, generation: int, seq: int, frame_type: str = "message"
) -> None:
    """Publish a raw frame as an outsider would: the executor's old message id
    (`<run>:<generation>:<seq>`), and no token."""
    data: dict[str, Any] = {"text": "FORGED "} if frame_type == "message" else {}
    if frame_type == "done":
        data = {"status": "finished"}
    raw = {
        "v": 1,
        "run_id": run_id,
        "tenant": "default",
        "generation": generation,
        "seq": seq,
        "type": frame_type,
        "data": data,
        "at": datetime.now(UTC).isoformat(),
    }
    await stack.client.nc.jetstream().publish(
        stack.client.subjects.frames_in("default", run_id),
        json.dumps(raw).encode(),
        headers={"Nats-Msg-Id": f"{run_id}:{generation}:{seq}"},
    )


async def test_forged_raw_frames_change_nothing_a_client_sees(stack: InProcessStack) -> None:
    first = await stack.client.submit(SLOW, session_id="s", multitask="enqueue")
    queued = await stack.client.submit(SLOW, session_id="s", multitask="enqueue")
    running = first.run.run_id

    async def started() -> bool:
        return (await stack.client.get(running)).status == RunStatus.RUNNING

    await eventually(started, timeout=20)
    # Ahead of the queued run: its first attempt's opening frames.
    for seq in (1, 2, 3):
        await _forge(stack, queued.run.run_id, 1, seq)
    # The running run: a frame the attempt has not published yet (same message id), the
    # next generation's first frame, and an early `done`.
    await _forge(stack, running, 1, 10)
    await _forge(stack, running, 2, 1)
    await _forge(stack, running, 1, 11, "done")

    results = []
    for run_id in (running, queued.run.run_id):
        frames, transcript = await collect(stack.client, run_id, timeout=60)
        results.append((frames, transcript, await stack.client.get(run_id)))

    for frames, transcript, run in results:
        assert run.status == RunStatus.FINISHED
        assert transcript.text == REAL_TEXT
        assert not any("FORGED" in json.dumps(f.data) for f in frames)
        assert [f.seq for f in frames] == list(range(1, len(frames) + 1))
        assert [f.type for f in frames].count(FrameType.DONE) == 1
        # run, twelve messages, done: every real frame, none lost to a forged id.
        assert len(frames) == 14
