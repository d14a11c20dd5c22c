"""API keys: each names one tenant. Only their SHA-256 is stored (a key is a random
token of 32 bytes, so a fast hash is enough: there is nothing to guess from it)."""

import hashlib
import hmac
import json
import logging
import secrets
from pathlib import Path

log = logging.getLogger(__name__)

KEY_PREFIX = "rw_"


def new_key() -> str:
    """A fresh API key."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class ApiKeys:
    """The keys file, read again whenever it changed on disk."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._tenants: dict[str, str] = {}

    def _load(self) -> None:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            self._stamp, self._tenants = None, {}
            return
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._stamp:
            return
        try:
            keys = json.loads(self.path.read_text())["keys"]
            self._tenants = {str(h): str(t) for h, t in keys.items()}
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            log.error("API keys file %s cannot be read (%s): no key is accepted", self.path, exc)
            self._tenants = {}
        self._stamp = stamp

    def tenant_of(self, key: str) -> str | None:
        """The tenant whose key this is, or None."""
        self._load()
        wanted = digest(key)
        for stored, tenant in self._tenants.items():
            if hmac.compare_digest(stored, wanted):
                return tenant
        return None


def add_key(path: Path, tenant: str, key: str) -> None:
    """Record `key` (hashed) for `tenant` in the keys file, creating it (mode 0600)."""
    keys: dict[str, str] = {}
    if path.exists():
        keys = json.loads(path.read_text())["keys"]
    keys[digest(key)] = tenant
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600, exist_ok=True)
    path.write_text(json.dumps({"keys": keys}, indent=2) + "\n")


def remove_tenant_keys(path: Path, tenant: str) -> int:
    """Forget every key of `tenant`; how many there were."""
    if not path.exists():
        return 0
    keys = json.loads(path.read_text())["keys"]
    kept = {h: t for h, t in keys.items() if t != tenant}
    path.write_text(json.dumps({"keys": kept}, indent=2) + "\n")
    return len(keys) - len(kept)
