"""runwire's test kit: test a runner against a real stack (needs `runwire[server,testing]`).

As a pytest plugin (loaded by itself once runwire is installed) it gives the fixtures
`runwire_servers`, `runwire_runners`, `runwire_stack` and `runwire_client`; see
`runwire.testing.plugin`. The same parts are here for other harnesses:

- `session_servers()`: nats-server and Postgres (containers, the pip wheels, or yours);
- `InProcessStack`: the four services in the caller's event loop, with given runners;
- `collect(client, run_id)`: every frame of a run until `done`, and its text;
- `eventually(check)`: wait for a condition instead of sleeping.
"""

from runwire.testing.servers import Servers, session_servers
from runwire.testing.stack import FAST, InProcessStack, collect, wait_ready
from runwire.testing.waiting import eventually

__all__ = [
    "FAST",
    "InProcessStack",
    "Servers",
    "collect",
    "eventually",
    "session_servers",
    "wait_ready",
]
