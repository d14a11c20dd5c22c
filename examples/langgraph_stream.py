"""The official LangGraph SDK through runwire's gateway: a thread, and a run on it
streamed as messages."""

import asyncio
import os

from langgraph_sdk import get_client


async def main() -> None:
    # The gateway and the tenant's API key, as `set -a; . .runwire/env; set +a` gives them.
    url, key = os.environ["RUNWIRE_GATEWAY_URL"], os.environ["RUNWIRE_API_KEY"]
    async with get_client(url=url, api_key=key) as client:
        thread = await client.threads.create()
        async for part in client.runs.stream(
            thread["thread_id"],
            "scripted",  # the runner; "openai" takes {"model": ..., "messages": [...]}
            input={"tokens": ["Hi", " there"]},
            stream_mode="messages-tuple",
        ):
            if part.event == "messages":
                message, _ = part.data
                print(message["content"], end="", flush=True)
    print()


asyncio.run(main())
