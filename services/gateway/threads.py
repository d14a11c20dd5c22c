"""LangGraph threads of every tenant, kept in the broker's key-value bucket
`<PREFIX>_THREADS` (keys `<tenant>.<thread_id>`), so that any gateway replica knows them:
id, metadata, times, the values of its settled runs, and the runs not yet settled
(`runs`: what each added to the values; the thread's status and values come from them,
see gateway/lgvalues.py)."""

import asyncio
import contextlib
import json
import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from runwire.client.settings import server_urls, tls_context
from runwire.contracts.subjects import GATEWAY_INBOX, Subjects

# Thread ids are keys of the bucket: letters, digits, '-' and '_'.
# How long the first request waits for the threads bucket to be made or found.
BUCKET_TIMEOUT_S = 30.0
# Listing a tenant's threads: how many a request asks for at once, and how long the
# server keeps the listing's consumer should the gateway die before deleting it.
LISTING_BATCH = 256
LISTING_IDLE_S = 60.0
THREAD_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


def valid_thread_id(thread_id: str) -> bool:
    return THREAD_ID.match(thread_id) is not None


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def upgraded(thread: dict[str, Any]) -> dict[str, Any]:
    """A thread as kept by an older gateway (only its newest run) in today's form."""
    if "runs" not in thread:
        last = thread.pop("last_run", None)
        thread.update(values=None, runs=[{"run_id": last}] if last else [], deleted=[])
    return thread


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
        self._js: Any = None
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
                # Creating a replicated bucket on a busy cluster can take seconds.
                js = self._js = self._nc.jetstream(timeout=BUCKET_TIMEOUT_S)
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
        return upgraded(json.loads(entry.value))

    async def create(
        self, tenant: str, thread_id: str, metadata: dict[str, Any]
    ) -> tuple[dict[str, Any], bool]:
        """The thread, and whether this call created it."""
        now = _now()
        thread: dict[str, Any] = {
            "thread_id": thread_id,
            "created_at": now,
            "updated_at": now,
            "metadata": metadata,
            "values": None,
            "runs": [],
            "deleted": [],
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

    async def change(
        self,
        tenant: str,
        thread_id: str,
        how: Callable[[dict[str, Any]], dict[str, Any] | None],
        *,
        tries: int = 20,
    ) -> dict[str, Any] | None:
        """Change the thread by `how` (given the thread, it returns the thread changed, or
        None to leave it), against concurrent changes (compare and set, tried again on a
        conflict); the thread as it now is, None when there is none."""
        kv = await self._bucket()
        key = f"{tenant}.{thread_id}"
        for _ in range(tries):
            try:
                entry = await kv.get(key)
            except KeyNotFoundError:
                return None
            if entry.value is None:
                return None
            thread = upgraded(json.loads(entry.value))
            changed = how(thread)
            if changed is None:
                return thread
            changed["updated_at"] = _now()
            try:
                await kv.update(key, json.dumps(changed).encode(), last=entry.revision)
            except KeyWrongLastSequenceError:
                continue
            return changed
        raise RuntimeError(f"thread {thread_id}: too many concurrent changes")

    async def delete(self, tenant: str, thread_id: str) -> None:
        await (await self._bucket()).delete(f"{tenant}.{thread_id}")

    async def all(self, tenant: str) -> list[dict[str, Any]]:
        """Every thread of the tenant: the last value of each of its keys, read by a
        consumer of this call's own, which says when it is made how many there are (a
        key-value watcher's "that was all" can come before values already on their way,
        and so list none)."""
        await self._bucket()
        bucket = Subjects(self.prefix).threads_bucket
        stream = f"KV_{bucket}"
        name = f"threads-{uuid.uuid4().hex}"
        made = await self._js.add_consumer(
            stream,
            ConsumerConfig(
                name=name,
                filter_subject=f"$KV.{bucket}.{tenant}.*",
                deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
                ack_policy=AckPolicy.NONE,
                mem_storage=True,
                inactive_threshold=LISTING_IDLE_S,
            ),
        )
        # By key: a thread changed while the listing runs comes again, and its last
        # value is the one listed (a deleted one is not).
        found: dict[str, dict[str, Any] | None] = {}
        reading = None
        try:
            reading = await self._js.pull_subscribe_bind(name=name, stream=stream)
            left = made.num_pending or 0
            while left > 0:
                try:
                    got = await reading.fetch(min(left, LISTING_BATCH))
                except nats.errors.TimeoutError:
                    got = []
                if not got:
                    break  # threads deleted meanwhile: fewer than counted are left
                for msg in got:
                    live = msg.data and (msg.headers or {}).get("KV-Operation") is None
                    found[msg.subject] = upgraded(json.loads(msg.data)) if live else None
                # What was there when the listing began, and no more than that.
                left = min(left - len(got), got[-1].metadata.num_pending)
        finally:
            if reading is not None:
                with contextlib.suppress(nats.errors.Error):
                    await reading.unsubscribe()
            with contextlib.suppress(nats.errors.Error):
                await self._js.delete_consumer(stream, name)
        return [thread for thread in found.values() if thread is not None]

    async def close(self) -> None:
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.close()
