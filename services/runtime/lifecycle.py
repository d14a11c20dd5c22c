"""Starting and stopping a service process: logs, traces, metrics, a clean exit.

A service is a FastStream application (`runwire.runtime.app`), started either by
`faststream run services.<name>.main:app` or by its `runwire-<name>` script (and
`python -m services.<name>`), which runs the same application through `run`. Either
way the application sets up the process when it starts (`setup_process`) and tears it
down when it stops; FastStream's runner turns SIGTERM and SIGINT into a graceful stop.
"""

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Protocol

from faststream import FastStream
from opentelemetry.sdk.trace import TracerProvider

from runwire.runtime import faults, logs, tracing
from runwire.runtime.errors import Unavailable
from runwire.runtime.metrics import serve_metrics, time_collections
from runwire.runtime.settings import EXIT_CONFIG, CommonSettings

log = logging.getLogger(__name__)

EXIT_UNAVAILABLE = 1


class CannotStart(Exception):
    """The process cannot start as configured; the message says why, in one line."""


def setup_process(name: str, settings: CommonSettings) -> TracerProvider | None:
    """Logs, the tracer provider and `/metrics` of a service process; returns the provider
    (to shut down at exit). Raises CannotStart for an unusable OTEL_* setting."""
    logs.setup(name, settings.log_level, settings.log_format)
    try:
        provider = tracing.setup(name)
        faults.arm(settings.fault_points)
    except (tracing.TracingConfigError, faults.FaultSpecError) as exc:
        raise CannotStart(str(exc)) from exc
    serve_metrics(name, settings.metrics_port, settings.metrics_host)
    time_collections()
    return provider


def teardown_process(provider: TracerProvider | None) -> None:
    """Export the spans still buffered and write the last log lines."""
    tracing.shutdown(provider)
    logs.shutdown()


class Runnable(Protocol):
    """What `run` needs: a service's name and its FastStream application."""

    @property
    def name(self) -> str: ...

    @property
    def settings(self) -> CommonSettings: ...

    @property
    def app(self) -> FastStream: ...


def _loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop for `auto` where it is installed (what `faststream run` picks too:
    every hop of a run costs less of the process's time), else None: asyncio's."""
    if choice == "auto":
        with contextlib.suppress(ImportError):
            import uvloop

            return uvloop.new_event_loop
    return None


def run(service: Runnable) -> None:
    """Run a service's application until SIGTERM or SIGINT; exit 1 when NATS or Postgres
    cannot be reached at start, 2 when the configuration is unusable."""
    try:
        with asyncio.Runner(loop_factory=_loop_factory(service.settings.event_loop)) as runner:
            runner.run(service.app.run())
    except CannotStart as exc:
        log.error("%s cannot start: %s", service.name, exc)
        raise SystemExit(EXIT_CONFIG) from exc
    except Unavailable as exc:
        log.error("%s cannot start: %s", service.name, exc.message)
        raise SystemExit(EXIT_UNAVAILABLE) from exc
    finally:
        logs.shutdown()
