"""LangGraph threads of every tenant, kept in the broker's key-value bucket
`<PREFIX>_THREADS` (keys `<tenant>.<thread_id>`), so that any gateway replica knows them:
id, metadata, times, and the thread's newest run (its status comes from that run)."""

import asyncio
import contextlib
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from runwire.client.settings import server_urls, tls_context
from runwire.contracts.subjects import GATEWAY_INBOX, Subjects


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


class Threads:
    """Threads of every tenant, in the broker's key-value bucket `<PREFIX>_THREADS`
    (keys `<tenant>.<thread_id>`), through a connection of the gateway's own."""

    def __init__(
        self,
        url: str,
        prefix: str,
        user: str | None,
        password: str | None,
        replicas: int = 1,
        *,
        tls_ca: Path | None = None,
    ) -> None:
        self.url, self.prefix, self.user, self.password = url, prefix, user, password
        self.replicas = replicas
        self.tls_ca = tls_ca
        self._kv: KeyValue | None = None
        self._nc: Any = None
        self._lock = asyncio.Lock()

    async def _bucket(self) -> KeyValue:
        if self._kv is not None:
            return self._kv
        async with self._lock:
            if self._kv is None:
                self._nc = await nats.connect(
                    server_urls(self.url),
                    dont_randomize=True,
                    user=self.user,
                    password=self.password,
                    inbox_prefix=GATEWAY_INBOX,
                    max_reconnect_attempts=-1,
                    tls=tls_context(self.tls_ca),
                )
                js = self._nc.jetstream()
                self._kv = await js.create_key_value(
                    bucket=Subjects(self.prefix).threads_bucket,
                    history=1,
                    replicas=self.replicas,
                )
            return self._kv

    async def get(self, tenant: str, thread_id: str) -> dict[str, Any] | None:
        try:
            entry = await (await self._bucket()).get(f"{tenant}.{thread_id}")
        except KeyNotFoundError:
            return None
        if entry.value is None:
            return None
        found: dict[str, Any] = json.loads(entry.value)
        return found

    async def create(
        self, tenant: str, thread_id: str, metadata: dict[str, Any]
    ) -> tuple[dict[str, Any], bool]:
        """The thread, and whether this call created it."""
        now = _now()
        thread = {
            "thread_id": thread_id,
            "created_at": now,
            "updated_at": now,
            "metadata": metadata,
            "last_run": None,
        }
        try:
            await (await self._bucket()).create(
                f"{tenant}.{thread_id}", json.dumps(thread).encode()
            )
        except KeyWrongLastSequenceError:
            existing = await self.get(tenant, thread_id)
            if existing is None:
                raise
            return existing, False
        return thread, True

    async def ran(self, tenant: str, thread: dict[str, Any], run_id: str) -> None:
        """Remember the thread's newest run (for its status)."""
        updated = {**thread, "last_run": run_id, "updated_at": _now()}
        await (await self._bucket()).put(
            f"{tenant}.{thread['thread_id']}", json.dumps(updated).encode()
        )

    async def close(self) -> None:
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.close()
