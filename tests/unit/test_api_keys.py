"""API keys that expire: a rotated tenant's previous keys, accepted a while longer."""

import hashlib
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from runwire.gateway.keys import ApiKeys, add_key, expire_tenant_keys, remove_tenant_keys

pytestmark = pytest.mark.unit


def test_a_key_is_accepted_until_it_expires_and_files_of_before_still_read(
    tmp_path: Path,
) -> None:
    path = tmp_path / "api-keys.json"
    # A file as runwire wrote it before keys could expire: digest -> tenant.
    path.write_text('{"keys": {"' + hashlib.sha256(b"rw_old").hexdigest() + '": "acme"}}')
    keys = ApiKeys(path)
    assert keys.tenant_of("rw_old") == "acme"
    add_key(path, "acme", "rw_new")
    add_key(path, "globex", "rw_theirs")
    assert expire_tenant_keys(path, "acme", datetime.now(UTC) + timedelta(hours=1), keep="rw_new")
    assert keys.tenant_of("rw_old") == "acme"  # within its grace
    expire_tenant_keys(path, "acme", datetime.now(UTC) - timedelta(seconds=1), keep="rw_new")
    assert keys.tenant_of("rw_old") is None
    assert keys.tenant_of("rw_new") == "acme"
    assert keys.tenant_of("rw_theirs") == "globex"
    assert remove_tenant_keys(path, "acme", keep="rw_new") == 1
    assert keys.tenant_of("rw_new") == "acme"
    assert keys.tenant_of("nope") is None
