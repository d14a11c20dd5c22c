"""Starting and stopping a service process: logs, traces, metrics, signals, a clean exit."""

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable

from services.runtime import logs, tracing
from services.runtime.errors import Unavailable
from services.runtime.metrics import serve_metrics
from services.runtime.settings import CommonSettings

log = logging.getLogger(__name__)


def run_service(
    name: str,
    settings: CommonSettings,
    main: Callable[[asyncio.Event], Awaitable[None]],
) -> None:
    """Run `main(stop)` until SIGTERM or SIGINT sets `stop`; exit 1 if it cannot start."""
    logs.setup(name, settings.log_level, settings.log_format)
    try:
        provider = tracing.setup(name)
    except tracing.TracingConfigError as exc:
        log.error("%s cannot start: %s", name, exc)
        raise SystemExit(2) from exc
    serve_metrics(name, settings.metrics_port, settings.metrics_host)

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        log.info("%s starting", name)
        await main(stop)
        log.info("%s stopped", name)

    try:
        asyncio.run(runner())
    except Unavailable as exc:
        log.error("%s cannot start: %s", name, exc.message)
        raise SystemExit(1) from exc
    finally:
        tracing.shutdown(provider)
        logs.shutdown()
