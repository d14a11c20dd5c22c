"""The server's configuration holds the identities' bcrypt hashes, never a password."""

import json
from pathlib import Path

import bcrypt
import pytest

from runwire.contracts.identities import tenant_user
from runwire.contracts.subjects import RESERVED_TENANTS, Subjects, valid_tenant
from runwire.infra.auth import Identities, render, tenant_permissions
from runwire.submitter.jetstream import intersects

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


def _services_subjects(s: Subjects) -> list[str]:
    """The subjects only services publish or read: jobs, raw frames, cancel notices."""
    return [s.jobs_wildcard, f"{s.prefix}.frames.in.*.*", s.frames_out_wildcard]


def test_no_tenant_name_reaches_the_services_subjects() -> None:
    """A tenant's permissions hang off its name: a name equal to a token of the services'
    subjects would share their space (`rw.jobs.JS.API.job`, the JetStream API of a
    tenant `jobs`, is a job subject). Such names are no tenant's."""
    s = Subjects("rw")
    for tenant in ("acme", "default", "JS", "in", "out", "runs", "cmd", "a-b_c", "job"):
        allowed = tenant_permissions(tenant, s)
        mine = allowed["publish"]["allow"] + allowed["subscribe"]["allow"]
        assert valid_tenant(tenant)
        assert not [(m, x) for m in mine for x in _services_subjects(s) if intersects(m, x)]
    assert any(
        intersects(m, s.jobs_wildcard) for m in tenant_permissions("jobs", s)["publish"]["allow"]
    )
    for tenant in sorted(RESERVED_TENANTS):
        assert not valid_tenant(tenant)
        with pytest.raises(ValueError, match="none of"):
            Identities.generate().add_tenant(tenant)
