"""runwire's test kit, given this folder's runner (not packaged, so not found by itself)."""

import pytest
from my_agents.echo import echo


@pytest.fixture
def runwire_runners() -> dict[str, object]:
    return {"echo": echo}
