"""When the queue worker calls again and how long it waits first. Pure."""

from __future__ import annotations


def retryable(status: int | None) -> bool:
    """A status worth another try: 429, any 5xx, or None (the gateway could not be reached)."""
    return status is None or status == 429 or status >= 500


def delay_s(attempt: int, base_s: float, max_s: float) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1, 2, ...): ``base_s`` doubled each time,
    at most ``max_s``."""
    if attempt < 1:
        raise ValueError(f"attempt {attempt}: attempts count from 1")
    return float(min(max_s, base_s * 2.0 ** min(attempt - 1, 60)))
