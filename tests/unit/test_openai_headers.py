"""What a model provider's headers say about waiting, as the `openai` runner reads them."""

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from runwire.runners.openai_headers import duration, rate_headers, retry_after


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("6m0s", 360.0), ("1.5s", 1.5), ("20ms", 0.02), ("1h2m3s", 3723.0), ("0s", 0.0)],
)
def test_a_providers_durations_are_read_in_seconds(text: str, seconds: float) -> None:
    assert duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "6 m", "5x", "-1s", "1s and more"])
def test_what_is_not_a_duration_is_none(text: str) -> None:
    assert duration(text) is None


def test_the_rate_limit_headers_say_what_is_left_until_when_and_of_what() -> None:
    said = rate_headers(
        {
            "x-ratelimit-limit-tokens": "30000",
            "x-ratelimit-remaining-tokens": "1200",
            "x-ratelimit-reset-tokens": "57.6s",
            "x-ratelimit-limit-requests": "500",
            "x-ratelimit-remaining-requests": "499",
            "x-ratelimit-reset-requests": "120ms",
        }
    )
    assert said == pytest.approx(
        {
            "tokens_left": 1200,
            "tokens_reset_s": 57.6,
            "tokens_limit": 30000,
            "requests_left": 499,
            "requests_reset_s": 0.12,
            "requests_limit": 500,
        }
    )


def test_headers_that_cannot_be_read_say_nothing() -> None:
    assert rate_headers({}) == {}
    assert (
        rate_headers({"x-ratelimit-remaining-tokens": "12", "x-ratelimit-reset-tokens": "?"}) == {}
    )
    # Without its limit, what is left and its reset still count (the wait lasts to it).
    assert rate_headers(
        {"x-ratelimit-remaining-tokens": "12", "x-ratelimit-reset-tokens": "2s"}
    ) == {"tokens_left": 12, "tokens_reset_s": 2.0}


def test_retry_after_in_milliseconds_seconds_or_a_date() -> None:
    assert retry_after({"retry-after-ms": "1500"}) == 1.5
    assert retry_after({"retry-after": "3"}) == 3.0
    later = datetime.now(UTC) + timedelta(seconds=30)
    assert 25 < (retry_after({"retry-after": format_datetime(later, usegmt=True)}) or 0) <= 30
    assert retry_after({"retry-after": "whenever"}) is None
    assert retry_after({}) is None


def test_what_a_runner_says_of_a_provider_is_kept_within_sense() -> None:
    from runwire.executor.rate_limits import MAX_PROVIDER_WAIT_S, _bounded
    from runwire.runners.base import RunnerError

    assert _bounded("tokens_left", 1200) == 1200
    # No tenant's runner holds every tenant's calls for a day.
    assert _bounded("retry_after_s", 86_400) == MAX_PROVIDER_WAIT_S
    assert _bounded("tokens_reset_s", 1.5) == 1.5
    for wrong in (float("nan"), float("inf"), -1.0):
        with pytest.raises(RunnerError):
            _bounded("retry_after_s", wrong)
