"""A service as a FastStream application, on the service's one NATS connection.

`Service` is what the four services have in common: settings, the Postgres store and the
NATS `Broker` it opens at start-up, FastStream's `NatsBroker` that serves its commands,
health and notices, and the background work it runs between start and stop (the
executor's job loop, the relay's pipeline, recovery's ticks). A service subclasses it,
makes its parts in `opened()` and runs its work in `work(stop)`.

One connection per process. FastStream's broker does not open a connection of its own:
it runs on the one our `Broker` opened (which retries while NATS is not up yet, logs
connection trouble once, and owns the pipelined JetStream publishes and batched Direct
Gets that FastStream cannot do). So a service is one NATS client, with one identity,
one reconnect loop and one place that closes it, after the service's own work has
ended. `ServiceBroker` is FastStream's broker with exactly that change.

Start: set up the process (logs, traces, metrics) when it is the service's own, connect
Postgres and NATS, declare the streams, make the parts, start FastStream's subscribers,
start the work. Stop (SIGTERM): stop taking commands and answer those in progress, stop
the work and wait for it, stop FastStream's other subscribers, close NATS and Postgres.
"""

import asyncio
import logging
import os
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Generic, TypeVar

from faststream import FastStream
from faststream.nats import NatsBroker
from nats.aio.client import Client as NatsClient
from opentelemetry.sdk.trace import TracerProvider

from runwire.client.settings import tls_context
from runwire.contracts.subjects import Subjects, service_inbox
from runwire.runtime import tracing
from runwire.runtime.broker import Broker
from runwire.runtime.lifecycle import CannotStart, setup_process, teardown_process
from runwire.runtime.logs import fields
from runwire.runtime.metrics import freeze_startup_objects
from runwire.runtime.outbox import Outbox
from runwire.runtime.settings import CommonSettings
from runwire.runtime.store import Store
from runwire.runtime.streams import StreamLimits

log = logging.getLogger(__name__)

S = TypeVar("S", bound=CommonSettings)

# FastStream's own lines (each message received and processed, task callbacks) are
# DEBUG and INFO; ours say what matters. Its warnings and errors still come through, as
# the service's log lines (not under `faststream`, whose logger writes to stdout).
_FASTSTREAM_LOG = logging.getLogger(f"{__name__}.faststream")
_FASTSTREAM_LOG.setLevel(logging.WARNING)
# How long a stopping service waits for FastStream's subscribers to finish a message.
GRACEFUL_S = 10.0


class ServiceBroker(NatsBroker):
    """FastStream's NATS broker, running on the connection of the service's `Broker`.

    `replies` names, by AsyncAPI channel title, what each request/reply subscriber
    answers (FastStream 0.7 documents a subscriber's request but not its reply);
    `runwire.asyncapi` puts them in the document.
    """

    def __init__(self, settings: CommonSettings, *, service: str) -> None:
        super().__init__(
            settings.nats_url,
            name=f"runwire-{service}",
            logger=_FASTSTREAM_LOG,
            log_level=logging.DEBUG,
            graceful_timeout=GRACEFUL_S,
            # Handlers get the decoded body as their one argument, nothing injected: the
            # injection (fast_depends) cost about 110 µs per command, some 11% of the
            # submitter's CPU per submit. Bodies are validated by our decoders.
            apply_types=False,
            description="Any NATS server with JetStream; this URL is the services' default.",
        )
        self.replies: dict[str, tuple[type[Any], ...]] = {}
        self._shared: NatsClient | None = None

    def share(self, connection: NatsClient) -> None:
        """Run on `connection` (the service's `Broker`'s) once started."""
        self._shared = connection

    async def _connect(self) -> NatsClient:
        if self._shared is None:
            raise RuntimeError("ServiceBroker started before the service connected to NATS")
        self.config.connect(self._shared)
        return self._shared

    async def stop(self, *exc_info: Any) -> None:
        # FastStream drains the connection it thinks it owns; this one is the Broker's,
        # closed by the service after its own work. Stopping the subscribers is enough.
        self._connection = None
        await super().stop(*exc_info)


class Service(Generic[S]):
    """One service: settings, store, broker, FastStream application and background work.

    `own_process=False` runs it inside another program (the in-process test stack): the
    process's logs, traces and metrics are then that program's, not the service's.
    """

    name: ClassVar[str]

    def __init__(self, settings: S, *, own_process: bool = True) -> None:
        self.settings = settings
        self.subjects = Subjects(settings.prefix)
        self.instance = f"{socket.gethostname()}:{os.getpid()}"
        self.own_process = own_process
        self.faststream = ServiceBroker(settings, service=self.name)
        self.app = FastStream(
            self.faststream,
            logger=None,
            on_startup=[self._open],
            after_startup=[self._start_work],
            on_shutdown=[self._stop_work],
            after_shutdown=[self._close],
        )
        self.started = time.monotonic()
        self._store: Store | None = None
        self._broker: Broker | None = None
        self._outbox: Outbox | None = None
        self._provider: TracerProvider | None = None
        self._stop = asyncio.Event()
        self._work: asyncio.Task[None] | None = None
        self._failed: BaseException | None = None
        # Called first when the service stops (the command subscribers' drain).
        self.stopping: list[Callable[[], Awaitable[None]]] = []

    # -- what a service provides --------------------------------------------------
    def prepare(self) -> None:
        """Check and load what the service is configured with, before it connects;
        raise CannotStart to stop it with the reason (exit status 2)."""

    def runner_names(self) -> list[str]:
        """The runners this replica serves or accepts, for its health reply."""
        return []

    def loaded_runners(self) -> list[str]:
        """The runners this replica loaded at start, for its health reply."""
        return []

    def opened(self) -> None:
        """Make the service's parts; the store and the broker are connected."""

    async def work(self, stop: asyncio.Event) -> None:
        """The service's background work, until `stop` is set (default: none)."""
        await stop.wait()

    # -- what a service uses ------------------------------------------------------
    @property
    def store(self) -> Store:
        if self._store is None:
            raise RuntimeError(f"{self.name}: the store is used before the service started")
        return self._store

    @property
    def broker(self) -> Broker:
        if self._broker is None:
            raise RuntimeError(f"{self.name}: the broker is used before the service started")
        return self._broker

    @property
    def outbox(self) -> Outbox:
        """Publishes what this process's transitions imply, right after they commit."""
        if self._outbox is None:
            raise RuntimeError(f"{self.name}: the outbox is used before the service started")
        return self._outbox

    async def serve(self, stop: asyncio.Event) -> None:
        """Run inside the caller's event loop until `stop` is set (or the work fails)."""
        async with self.app:
            stopped = asyncio.create_task(stop.wait())
            assert self._work is not None
            await asyncio.wait({stopped, self._work}, return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()

    # -- the application's hooks --------------------------------------------------
    async def _open(self) -> None:
        if self.own_process:
            self._provider = setup_process(self.name, self.settings)
        loop = asyncio.get_running_loop()
        log.info(
            "%s starting", self.name, extra=fields(event_loop=type(loop).__module__.split(".")[0])
        )
        settings = self.settings
        try:
            self.prepare()
            try:
                tls = tls_context(settings.nats_tls_ca)
            except (OSError, ssl.SSLError) as exc:
                raise CannotStart(f"RUNWIRE_NATS_TLS_CA: {exc}") from exc
            self._store = await Store.connect(
                settings.database_url, pool_size=settings.db_pool_size
            )
            self._broker = await Broker.connect(
                settings.nats_url,
                self.subjects,
                name=f"runwire-{self.name}",
                user=settings.nats_user,
                password=(
                    settings.nats_password.get_secret_value() if settings.nats_password else None
                ),
                ping_interval_s=settings.nats_ping_interval_ms / 1000,
                inbox=service_inbox(self.name),
                tls=tls,
            )
            await self._broker.ensure_streams(StreamLimits.of(settings))
        except BaseException:
            # Nothing else will run: close what was opened (the log lines are written
            # by whoever reports the failure).
            await self._close_connections()
            tracing.shutdown(self._provider)
            raise
        self.faststream.share(self._broker.nc)
        self._outbox = Outbox(self._store, self._broker)
        self.started = time.monotonic()
        self.opened()

    async def _start_work(self) -> None:
        if self.own_process:  # not a test's objects, when the stack runs inside it
            freeze_startup_objects()
        self._work = asyncio.create_task(self.work(self._stop), name=f"{self.name}-work")
        self._work.add_done_callback(self._work_ended)
        log.info("%s ready", self.name)

    def _work_ended(self, task: "asyncio.Task[None]") -> None:
        if task.cancelled() or task.exception() is None or self._stop.is_set():
            return
        # The service cannot do its job any more: stop it rather than answer health
        # requests as if nothing were wrong. The error is raised again at the end.
        self._failed = task.exception()
        log.error("%s: its work failed; stopping", self.name, exc_info=self._failed)
        self.app.exit()

    async def _stop_work(self) -> None:
        log.info("%s stopping", self.name)
        for stop_part in self.stopping:
            await stop_part()
        self._stop.set()
        if self._work is not None:
            try:
                await self._work
            except Exception as exc:  # noqa: BLE001 - raised again once all is closed
                self._failed = self._failed or exc

    async def _close_connections(self) -> None:
        if self._outbox is not None:
            await self._outbox.close()  # what was published leaves the outbox table
        if self._broker is not None:
            await self._broker.close()
        if self._store is not None:
            await self._store.close()

    async def _close(self) -> None:
        await self._close_connections()
        log.info("%s stopped", self.name)
        if self.own_process:
            teardown_process(self._provider)
        if self._failed is not None:
            raise self._failed
