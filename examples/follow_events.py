"""Follow the tenant's run events (every transition of every run) while a run goes by."""

import asyncio

from runwire import Client


async def main() -> None:
    async with await Client.connect() as client:
        events = await client.events()  # or client.events(run_id); CLI: runwire events
        reply = await client.submit({"tokens": ["Hello"]})
        async for event in events:
            if event.run_id == reply.run.run_id:
                print(event.event, event.status)
                if event.status.terminal:
                    break


asyncio.run(main())
