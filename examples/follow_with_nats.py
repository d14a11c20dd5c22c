"""Submit a run and follow its frames with the official NATS client alone (nats-py), as
a program in any language would: the submit is a request, the frames come from an
ordered consumer made through the tenant's JetStream API prefix. Its settings come from
the environment (`set -a; . .runwire/env`)."""

import asyncio
import json
import os
import ssl
import uuid

import nats


async def main() -> None:
    prefix = os.environ.get("RUNWIRE_PREFIX", "rw")
    tenant = os.environ.get("RUNWIRE_TENANT", "default")
    ca = os.environ.get("RUNWIRE_NATS_TLS_CA")
    nc = await nats.connect(
        os.environ.get("RUNWIRE_NATS_URL", "nats://127.0.0.1:4222").split(","),
        user=os.environ.get("RUNWIRE_NATS_USER"),
        password=os.environ.get("RUNWIRE_NATS_PASSWORD"),
        tls=ssl.create_default_context(cafile=ca) if ca else None,
        inbox_prefix=f"_INBOX_{tenant}",  # where a tenant's replies and deliveries go
    )
    submit = {"v": 1, "request_id": str(uuid.uuid4()), "input": {"tokens": ["Hi", " there"]}}
    answer = await nc.request(f"{prefix}.{tenant}.cmd.submit", json.dumps(submit).encode(), 10)
    subject = json.loads(answer.data)["frames"]["subject"]

    js = nc.jetstream(prefix=f"{prefix}.{tenant}.JS.API")  # the tenant's JetStream API
    frames = await js.subscribe(subject, ordered_consumer=True)  # every frame, once, in order
    text = ""
    while True:
        frame = json.loads((await frames.next_msg(timeout=30)).data)
        if frame["type"] == "message":
            text += frame["data"]["text"]
        elif frame["type"] == "done":
            print(repr(text), frame["data"]["status"])
            break
    await nc.close()


asyncio.run(main())
