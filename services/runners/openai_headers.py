"""What a model provider's response headers say about waiting: `Retry-After` and the
rate-limit headers (`x-ratelimit-remaining-tokens`, `x-ratelimit-reset-tokens`, ...)."""

import contextlib
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration(text: str) -> float | None:
    """Seconds of a provider's duration (`6m0s`, `1.5s`, `20ms`), or None."""
    parts = DURATION_PART.findall(text.strip())
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        return None
    return sum(float(n) * DURATION_UNITS[u] for n, u in parts)


def rate_headers(headers: Mapping[str, str]) -> dict[str, float]:
    """What a provider's rate-limit headers say: the tokens and requests left, the
    seconds until each is full again, and each limit (`x-ratelimit-remaining-tokens`,
    `x-ratelimit-reset-tokens`, `x-ratelimit-limit-tokens`, ...)."""
    said: dict[str, float] = {}
    for unit in ("tokens", "requests"):
        left = headers.get(f"x-ratelimit-remaining-{unit}")
        reset = duration(headers.get(f"x-ratelimit-reset-{unit}") or "")
        if left is None or reset is None:
            continue
        with contextlib.suppress(ValueError):
            said[f"{unit}_left"] = float(int(left))
            said[f"{unit}_reset_s"] = reset
            said[f"{unit}_limit"] = float(int(headers.get(f"x-ratelimit-limit-{unit}", "")))
    return said


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds a provider asks to wait (`retry-after-ms`, `Retry-After` in seconds or as
    an HTTP date)."""
    if (ms := headers.get("retry-after-ms")) is not None:
        with contextlib.suppress(ValueError):
            return max(0.0, float(ms) / 1000)
    value = headers.get("retry-after")
    if value is None:
        return None
    with contextlib.suppress(ValueError):
        return max(0.0, float(value))
    with contextlib.suppress(TypeError, ValueError):
        return max(0.0, (parsedate_to_datetime(value) - datetime.now(UTC)).total_seconds())
    return None
