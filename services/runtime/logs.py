"""Structured logs: JSON lines (or readable text on a terminal) carrying run context.

A line written inside a span also carries its `trace_id` and `span_id`, so that the logs
of one run can be found from its trace and the other way round.

`bind(run_id=..., attempt=...)` puts fields in a context variable, so every log line
written while handling that run carries them without threading them through calls.
"""

import atexit
import contextlib
import contextvars
import json
import logging
import queue
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, TextIO

import orjson

from runwire.runtime.tracing import current_ids

_context: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "runwire_log_context", default=None
)
_SERVICE = {"name": "runwire"}
_WRITER: dict[str, "_LineWriter"] = {}
WRITE_EVERY_S = 0.02


@contextlib.contextmanager
def bind(**fields: Any) -> Iterator[None]:
    """Add fields (run_id, tenant, attempt, ...) to every log line inside the block."""
    token = _context.set({**(_context.get() or {}), **fields})
    try:
        yield
    finally:
        _context.reset(token)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, service, message, context, extras."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "service": _SERVICE["name"],
            "logger": record.name,
            "msg": record.getMessage(),
        }
        line.update(_context.get() or {})
        ids = current_ids()
        if ids is not None:
            line["trace_id"], line["span_id"] = ids
        extra = getattr(record, "fields", None)
        if isinstance(extra, dict):
            line.update(extra)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        # orjson: a log line per run's step is on the hot path (a quarter of json's time);
        # json for what orjson refuses (an integer past 64 bits).
        try:
            return orjson.dumps(line, default=str).decode()
        except orjson.JSONEncodeError:
            return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    """Readable lines for a person at a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        fields = {**(_context.get() or {}), **(getattr(record, "fields", None) or {})}
        ids = current_ids()
        if ids is not None:
            fields["trace_id"] = ids[0]
        tail = " ".join(f"{k}={v}" for k, v in fields.items())
        text = f"{record.levelname.lower():7} {_SERVICE['name']}: {record.getMessage()} {tail}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text.rstrip()


class _LineWriter(logging.Handler):
    """Formats each record where it is logged (the run's context and span are read
    there) and hands the line to a thread that writes whatever has piled up in one
    write, so a slow reader of stderr (a full pipe to a supervisor) never stalls the
    event loop and a busy service does not pay a write per line."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self._stream = stream
        self._lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._write, name="log-writer", daemon=True)
        self._thread.start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._lines.put(self.format(record))
        except Exception:  # noqa: BLE001 - a log line must never break the caller
            self.handleError(record)

    def _write(self) -> None:
        while True:
            line = self._lines.get()
            # Let lines pile up a little: one wake-up and one write for many of them.
            time.sleep(WRITE_EVERY_S)
            batch = []
            while line is not None:
                batch.append(line)
                try:
                    line = self._lines.get_nowait()
                except queue.Empty:
                    break
            if batch:
                with contextlib.suppress(OSError, ValueError):
                    self._stream.write("\n".join(batch) + "\n")
                    self._stream.flush()
            if line is None:
                return

    def close(self) -> None:
        """Write every line still queued, then stop the thread."""
        if self._thread.is_alive():
            self._lines.put(None)
            self._thread.join(timeout=5)
        super().close()


def setup(service: str, level: str = "INFO", fmt: str = "auto") -> None:
    """Configure the root logger for a service process."""
    _SERVICE["name"] = service
    shutdown()
    use_text = fmt == "text" or (fmt == "auto" and sys.stderr.isatty())
    writer = _LineWriter(sys.stderr)
    writer.setFormatter(TextFormatter() if use_text else JsonFormatter())
    _WRITER["handler"] = writer
    atexit.register(shutdown)
    root = logging.getLogger()
    root.handlers[:] = [writer]
    root.setLevel(level)
    # The NATS client logs every reconnect attempt at ERROR; ours say it once, with context.
    logging.getLogger("nats").setLevel(logging.CRITICAL)
    # The model SDK's HTTP library logs every request at INFO (and its headers at DEBUG):
    # the `openai` runner reports what matters (errors, retries) itself.
    for name in ("httpx", "httpx2", "httpcore", "httpcore2", "openai"):
        logging.getLogger(name).setLevel(max(logging.getLevelName(level), logging.WARNING))


def shutdown() -> None:
    """Write every line still queued (at exit)."""
    writer = _WRITER.pop("handler", None)
    if writer is not None:
        logging.getLogger().removeHandler(writer)
        writer.close()


def fields(**values: Any) -> dict[str, Any]:
    """`log.info("...", extra=fields(code=...))`: extra keys for one line."""
    return {"fields": values}
