"""Submit a run and stream its text: the SDK finds the stack as the CLI does."""

import asyncio

from runwire import Client, Transcript
from runwire.contracts.frames import FrameType


async def main() -> None:
    async with await Client.connect() as client:  # the stack `make up` started
        reply = await client.submit({"tokens": ["Hello", " world"]})
        transcript = Transcript()
        async for frame in client.stream(reply.run.run_id):
            transcript.apply(frame)
            if frame.type == FrameType.DONE:
                print(repr(transcript.text), frame.data["status"])


asyncio.run(main())
