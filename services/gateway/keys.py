"""API keys: each names one tenant, and may expire (a rotated key, accepted a while
longer). Only their SHA-256 is stored (a key is a random token of 32 bytes, so a fast
hash is enough: there is nothing to guess from it)."""

import hashlib
import hmac
import json
import logging
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

log = logging.getLogger(__name__)

KEY_PREFIX = "rw_"


def new_key() -> str:
    """A fresh API key."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class KeyEntry:
    """Whose key it is, and until when it is accepted (None: until removed)."""

    tenant: str
    expires_at: datetime | None = None

    @classmethod
    def parse(cls, value: object) -> "KeyEntry":
        """An entry of the file: the tenant's name (as keys were first written), or
        `{"tenant": ..., "expires_at": RFC 3339}`."""
        if isinstance(value, str):
            return cls(value)
        if isinstance(value, dict):
            expires = value.get("expires_at")
            return cls(str(value["tenant"]), datetime.fromisoformat(expires) if expires else None)
        raise ValueError(f"a key's entry is {type(value).__name__}, not a tenant")

    def dumped(self) -> str | dict[str, str]:
        if self.expires_at is None:
            return self.tenant
        return {"tenant": self.tenant, "expires_at": self.expires_at.isoformat()}

    def valid(self, now: datetime) -> bool:
        return self.expires_at is None or now < self.expires_at


class ApiKeys:
    """The keys file, read again whenever it changed on disk."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._entries: dict[str, KeyEntry] = {}

    def _load(self) -> None:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            self._stamp, self._entries = None, {}
            return
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._stamp:
            return
        try:
            self._entries = _read(self.path)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.error("API keys file %s cannot be read (%s): no key is accepted", self.path, exc)
            self._entries = {}
        self._stamp = stamp

    def tenant_of(self, key: str) -> str | None:
        """The tenant whose key this is, while it is valid; or None."""
        self._load()
        wanted = digest(key)
        now = datetime.now(UTC)
        for stored, entry in self._entries.items():
            if hmac.compare_digest(stored, wanted):
                return entry.tenant if entry.valid(now) else None
        return None


def _read(path: Path) -> dict[str, KeyEntry]:
    keys = json.loads(path.read_text())["keys"]
    return {str(h): KeyEntry.parse(v) for h, v in keys.items()}


def _write(path: Path, entries: dict[str, KeyEntry]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600, exist_ok=True)
    keys = {h: entry.dumped() for h, entry in entries.items()}
    path.write_text(json.dumps({"keys": keys}, indent=2) + "\n")


def add_key(path: Path, tenant: str, key: str, expires_at: datetime | None = None) -> None:
    """Record `key` (hashed) for `tenant` in the keys file, creating it (mode 0600)."""
    entries = _read(path) if path.exists() else {}
    entries[digest(key)] = KeyEntry(tenant, expires_at)
    _write(path, entries)


def expire_tenant_keys(path: Path, tenant: str, at: datetime, *, keep: str | None = None) -> int:
    """Have every key of `tenant` but `keep` expire at `at` (or sooner, if it would);
    how many."""
    if not path.exists():
        return 0
    entries = _read(path)
    kept = digest(keep) if keep is not None else None
    changed = 0
    for stored, entry in entries.items():
        if entry.tenant != tenant or stored == kept:
            continue
        if entry.expires_at is None or entry.expires_at > at:
            entries[stored] = KeyEntry(tenant, at)
            changed += 1
    _write(path, entries)
    return changed


def remove_tenant_keys(path: Path, tenant: str, *, keep: str | None = None) -> int:
    """Forget every key of `tenant` (but `keep`); how many there were."""
    if not path.exists():
        return 0
    entries = _read(path)
    kept_digest = digest(keep) if keep is not None else None
    kept = {h: e for h, e in entries.items() if e.tenant != tenant or h == kept_digest}
    _write(path, kept)
    return len(entries) - len(kept)
