"""A runwire stack inside the test's event loop: the four services against a database and
a subject prefix of the test's own, with the test's runners registered, and a client.

Clocks are short (heartbeats of 100 ms, leases of 1 s, ticks of 50-100 ms) so that
retries and recoveries happen within a test's patience. The executors' `http` effects may
reach loopback (127.0.0.0/8), where a test's fake endpoints listen; a tenant may perform
effects once the test allows them, as an operator would (`await stack.allow_effects("http")`).
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import nats.errors

from runwire.client import Client, ClientError, Transcript
from runwire.contracts.errors import ErrorCode
from runwire.contracts.frames import Frame
from runwire.contracts.identities import OPERATOR, service_user, tenant_user
from runwire.contracts.replies import PolicyReply
from runwire.executor.main import serve as serve_executor
from runwire.infra.auth import Identities, database_url_as, service_role
from runwire.recovery.main import serve as serve_recovery
from runwire.relay.main import serve as serve_relay
from runwire.runtime.settings import (
    ExecutorSettings,
    RecoverySettings,
    RelaySettings,
    SubmitterSettings,
)
from runwire.runtime.store import Store
from runwire.submitter.main import serve as serve_submitter
from runwire.testing.waiting import eventually

# Short clocks so that failures are detected and recovered within a test's patience.
FAST = {
    "heartbeat_ms": 100,
    "lease_ttl_ms": 1000,
    "ack_wait_ms": 2000,
    "retry_base_ms": 50,
    "retry_max_ms": 200,
    "abort_grace_ms": 200,
    "drain_ms": 5000,
    "segment_flush_ms": 20,
    "recovery_interval_ms": 100,
    "waiting_gauges_interval_ms": 100,
    "effect_reconcile_ms": 100,
    "recovery_backoff_ms": 50,
    "republish_after_ms": 2000,
    "outbox_grace_ms": 1000,
    "outbox_interval_ms": 50,
    "presence_settle_ms": 1000,
    "nats_ping_interval_ms": 1000,
    "db_pool_size": 4,
    "log_level": "INFO",
    # Not a clock: the servers a test's effects call listen on loopback, which an
    # executor refuses unless its operator allows the network (none by default).
    "effect_http_allow_networks": "127.0.0.0/8",
}


def _fields(cls: type[Any], values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if k in cls.model_fields}


@dataclass
class InProcessStack:
    """The four services as tasks of the test's event loop, plus a client and a store."""

    nats_url: str
    db_url: str
    prefix: str
    overrides: dict[str, Any] = field(default_factory=dict)
    # Executors started by `async with` (0: jobs stay queued until a test starts one).
    executors: int = 1
    # Runners handed to the submitter and the executors, beside the installed ones, and
    # tools handed to the executors.
    runners: dict[str, Any] = field(default_factory=dict)
    tools: dict[str, Any] = field(default_factory=dict)
    # On a broker that enforces identities: each service connects as its own, the client
    # as the `default` tenant's (else the operator's).
    identities: Identities | None = None
    # Each service connects to Postgres as its own role (`runwire_<service>`, which must
    # be able to log in), not as the test's user.
    db_roles: bool = False
    client: Client = field(init=False)
    store: Store = field(init=False)
    _services: dict[str, tuple[asyncio.Task[None], asyncio.Event]] = field(
        default_factory=dict, init=False
    )

    def settings(self, cls: type[Any], service: str | None = None, **extra: Any) -> Any:
        if self.identities is not None and service is not None:
            user = service_user(service)
            extra = {"nats_user": user, "nats_password": self.identities.passwords[user], **extra}
        database_url = self.db_url
        if self.db_roles and service is not None:
            database_url = database_url_as(self.db_url, service_role(service))
        values = {
            **FAST,
            **self.overrides,
            **extra,
            "nats_url": self.nats_url,
            "database_url": database_url,
            "prefix": self.prefix,
            "log_format": "json",
        }
        return cls(**_fields(cls, values))

    def _start(
        self,
        name: str,
        serve: Callable[[Any, asyncio.Event], Coroutine[Any, Any, None]],
        settings: Any,
    ) -> None:
        stop = asyncio.Event()
        self._services[name] = (asyncio.create_task(serve(settings, stop), name=name), stop)

    async def start(self, *, executors: int = 1) -> InProcessStack:
        self.store = await Store.connect(self.db_url, pool_size=2)
        self._start(
            "submitter",
            functools.partial(serve_submitter, runners=self.runners),
            self.settings(SubmitterSettings, "submitter"),
        )
        self._start("relay", serve_relay, self.settings(RelaySettings, "relay"))
        self._start("recovery", serve_recovery, self.settings(RecoverySettings, "recovery"))
        for i in range(executors):
            self.start_executor(f"executor-{i}")
        user, password = self._client_identity()
        self.client = await Client.connect(
            self.nats_url,
            prefix=self.prefix,
            tenant="default",
            user=user,
            password=password,
            tls_ca=self.overrides.get("nats_tls_ca"),
        )
        await wait_ready(self.client)
        for service in ("recovery", "executor") if executors else ("recovery",):
            await wait_answering(self.client, service)
        return self

    def _client_identity(self) -> tuple[str | None, str | None]:
        if self.identities is None:
            return None, None
        for user in (tenant_user("default"), OPERATOR):
            if user in self.identities.passwords:
                return user, self.identities.passwords[user]
        return None, None

    async def allow_effects(self, *kinds: str, tenant: str = "default") -> PolicyReply:
        """Let `tenant`'s runs perform effects of `kinds` (none named: every kind), as an
        operator does (`runwire --env .runwire/operator.env --tenant T policy --effects
        http`): a tenant may perform no effect until then. Its runs submitted before
        hold a stale authorization afterwards, so call it before submitting."""
        user, password = None, None
        if self.identities is not None:
            user, password = OPERATOR, self.identities.passwords[OPERATOR]
        async with await Client.connect(
            self.nats_url, prefix=self.prefix, tenant=tenant, user=user, password=password
        ) as operator:
            return await operator.set_policy(effects=list(kinds) or None)

    async def __aenter__(self) -> InProcessStack:
        return await self.start(executors=self.executors)

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def start_recovery(self, name: str) -> None:
        self._start(name, serve_recovery, self.settings(RecoverySettings, "recovery"))

    def start_relay(self, name: str) -> None:
        self._start(name, serve_relay, self.settings(RelaySettings, "relay"))

    def start_executor(
        self, name: str = "executor-0", runners: dict[str, Any] | None = None, **extra: Any
    ) -> None:
        """An executor with `runners` (the stack's by default) beside the installed ones."""
        self._start(
            name,
            functools.partial(
                serve_executor,
                runners=self.runners if runners is None else runners,
                tools=self.tools,
            ),
            self.settings(ExecutorSettings, "executor", executor_id=name, **extra),
        )

    async def stop_service(self, name: str, timeout: float = 15.0) -> None:
        task, stop = self._services.pop(name)
        stop.set()
        await asyncio.wait_for(task, timeout)

    async def close(self) -> None:
        await self.client.close()
        for name in list(self._services):
            task, stop = self._services[name]
            stop.set()
        for name, (task, _) in list(self._services.items()):
            try:
                await asyncio.wait_for(task, 15)
            except (Exception, asyncio.CancelledError) as exc:  # noqa: BLE001
                print(f"service {name} did not stop cleanly: {exc!r}")
        self._services.clear()
        await self.store.close()

    def check_alive(self) -> None:
        """Fail if a service task died (its exception would otherwise go unseen)."""
        for name, (task, _) in self._services.items():
            if task.done():
                raise AssertionError(f"service {name} exited: {task.exception()!r}")


async def wait_ready(client: Client, timeout: float = 30) -> None:
    """Until the submitter and the relay answer (NOT_FOUND for a run that does not exist)."""
    probe = str(uuid.uuid4())

    async def answered(call: Callable[[str], Awaitable[Any]]) -> bool:
        try:
            await call(probe)
        except ClientError as exc:
            if exc.code == ErrorCode.NOT_FOUND:
                return True
            raise AssertionError(f"not ready: {exc}") from exc
        return True

    async def submitter() -> bool:
        return await answered(client.get)

    async def relay() -> bool:
        return await answered(client.join)

    await eventually(submitter, timeout=timeout, interval=0.1)
    await eventually(relay, timeout=timeout, interval=0.1)


async def wait_answering(client: Client, service: str, timeout: float = 30) -> None:
    """Until `service` (a kind: executor, recovery, ...) answers its health request: its
    start, which opens every Postgres connection first, is over."""

    async def answers() -> bool:
        try:
            await client.nc.request(client.subjects.health(service), b"", timeout=1)
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
            return False
        return True

    await eventually(answers, timeout=timeout, interval=0.05)


async def collect(
    client: Client, run_id: str, after: int = 0, timeout: float = 30
) -> tuple[list[Frame], Transcript]:
    """Every frame of a run after a cursor until `done`, and the text they make."""
    frames: list[Frame] = []
    transcript = Transcript()

    async def read() -> None:
        async for frame in client.stream(run_id, after):
            frames.append(frame)
            transcript.apply(frame)

    await asyncio.wait_for(read(), timeout)
    return frames, transcript
