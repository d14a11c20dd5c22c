"""Structured logs: JSON lines (or readable text on a terminal) carrying run context.

A line written inside a span also carries its `trace_id` and `span_id`, so that the logs
of one run can be found from its trace and the other way round.

`bind(run_id=..., attempt=...)` puts fields in a context variable, so every log line
written while handling that run carries them without threading them through calls.
"""

import contextlib
import contextvars
import json
import logging
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from services.runtime.tracing import current_ids

_context: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "runwire_log_context", default=None
)
_SERVICE = {"name": "runwire"}


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


def setup(service: str, level: str = "INFO", fmt: str = "auto") -> None:
    """Configure the root logger for a service process."""
    _SERVICE["name"] = service
    handler = logging.StreamHandler(sys.stderr)
    use_text = fmt == "text" or (fmt == "auto" and sys.stderr.isatty())
    handler.setFormatter(TextFormatter() if use_text else JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # The NATS client logs every reconnect attempt at ERROR; ours say it once, with context.
    logging.getLogger("nats").setLevel(logging.CRITICAL)


def fields(**values: Any) -> dict[str, Any]:
    """`log.info("...", extra=fields(code=...))`: extra keys for one line."""
    return {"fields": values}
