"""The server's configuration holds the identities' bcrypt hashes, never a password."""

import json
from pathlib import Path

import bcrypt
import pytest

from runwire.contracts.identities import tenant_user
from runwire.contracts.subjects import Subjects
from runwire.infra.auth import Identities, render

pytestmark = pytest.mark.unit


def _users(config: str) -> dict[str, str]:
    block = json.loads(config.split("authorization: ", 1)[1])
    return {user["user"]: user["password"] for user in block["users"]}


def test_the_servers_configuration_holds_hashes_that_check_the_passwords(tmp_path: Path) -> None:
    identities = Identities.generate()
    identities.add_tenant("acme")
    config = render(identities, Subjects("rw"))
    users = _users(config)
    assert sorted(users) == sorted(identities.passwords)
    for name, password in identities.passwords.items():
        assert password not in config
        assert users[name].startswith("$2a$")
        assert bcrypt.checkpw(password.encode(), users[name].encode())

    # Saved and loaded, the hashes are kept (none made again); a new password gets a
    # new one.
    identities.save(tmp_path / "identities.json")
    loaded = Identities.load(tmp_path / "identities.json")
    assert _users(render(loaded, Subjects("rw"))) == users
    loaded.passwords[tenant_user("acme")] = "rotated"
    again = _users(render(loaded, Subjects("rw")))
    assert bcrypt.checkpw(b"rotated", again[tenant_user("acme")].encode())
    assert {n: h for n, h in again.items() if n != tenant_user("acme")} == {
        n: h for n, h in users.items() if n != tenant_user("acme")
    }
