"""Publish a workflow's release, run it, and follow its nodes as they change."""

import asyncio
import json
from pathlib import Path

from runwire import Client
from runwire.contracts.frames import FrameType

GREETING = Path(__file__).parent / "workflows" / "greeting.json"


async def main() -> None:
    async with await Client.connect() as client:
        # For good: the same definition again answers `created: false`, another is refused.
        await client.release("greeting", 1, json.loads(GREETING.read_text()))
        reply = await client.submit_workflow("greeting", {"name": "Ada"})
        async for frame in client.stream(reply.run.run_id):
            if frame.type == FrameType.NODE:
                print(frame.data["node_id"], frame.data["action"])
            elif frame.type == FrameType.DONE:
                run = await client.get(reply.run.run_id)
                print(frame.data["status"], repr(run.result["outputs"]["sign"]["text"]))


asyncio.run(main())
