"""The runs of one session: a new run interrupts the one going on, and enqueued runs
wait their turn."""

import asyncio
from itertools import pairwise

from runwire import Client
from runwire.contracts.frames import FrameType


async def ended(client: Client, run_id: str) -> str:
    """How a run ended: its status, and its code if it did not finish."""
    async for frame in client.stream(run_id):
        if frame.type == FrameType.DONE:
            return " ".join(filter(None, (frame.data["status"], frame.data.get("code"))))
    raise AssertionError("a run's frames end with done")


async def main() -> None:
    async with await Client.connect() as client:
        # A long answer: twenty words, a fifth of a second apart.
        long = await client.submit(
            {"tokens": ["word "] * 20, "token_delay_ms": 200}, session_id="chat-1"
        )
        # While it streams, a new run of the session: `interrupt` (the default) cancels it.
        new = await client.submit({"tokens": ["the new answer"]}, session_id="chat-1")
        print("long answer:", await ended(client, long.run.run_id))  # canceled SUPERSEDED
        print("new answer:", await ended(client, new.run.run_id))  # finished
        # `enqueue`: each run starts once every run before it in the session has ended.
        turns = [
            await client.submit(
                {"tokens": [text], "token_delay_ms": 100}, session_id="chat-1", multitask="enqueue"
            )
            for text in ("first", "second", "third")
        ]
        for turn in turns:
            await ended(client, turn.run.run_id)
        runs = [await client.get(turn.run.run_id) for turn in turns]
        in_turn = all(run.started_at >= before.ended_at for before, run in pairwise(runs))
        print("first, second, third, one after the other:", in_turn)  # True


asyncio.run(main())
