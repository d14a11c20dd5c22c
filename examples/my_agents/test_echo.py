"""The echo runner on a real stack: runwire's test kit gives `runwire_client`."""

from runwire.testing import collect


async def test_echo(runwire_client):
    reply = await runwire_client.submit({"text": "hi ", "times": 2}, runner="echo")
    _, transcript = await collect(runwire_client, reply.run.run_id)
    assert transcript.text == "hi hi "
