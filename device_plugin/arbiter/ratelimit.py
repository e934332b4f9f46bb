"""Log lines a client can cause, at a bounded rate.

A misbehaving or hostile process can send thousands of bad requests a second; each one would
write a log line. :class:`RepeatLimiter` lets through the first ``burst`` lines of one kind
(its format string and level) per ``interval_s``, counts the rest, and adds the count to the
next line of that kind that is let through, so nothing is hidden silently.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import attrs


@attrs.define
class _Kind:
    window_start: float
    lines: int = 0
    suppressed: int = 0


class RepeatLimiter:
    def __init__(self, logger: logging.Logger, *, burst: int = 5, interval_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._logger = logger
        self._burst = burst
        self._interval_s = interval_s
        self._clock = clock
        self._kinds: dict[tuple[int, str], _Kind] = {}

    def log(self, level: int, message: str, *args: object) -> None:
        if not self._logger.isEnabledFor(level):
            return
        now = self._clock()
        kind = self._kinds.get((level, message))
        if kind is None or now - kind.window_start >= self._interval_s:
            suppressed = kind.suppressed if kind is not None else 0
            kind = self._kinds[(level, message)] = _Kind(now)
            if suppressed:
                message = f"{message} [{suppressed} more like this suppressed]"
        if kind.lines >= self._burst:
            kind.suppressed += 1
            return
        kind.lines += 1
        self._logger.log(level, message, *args)

    def info(self, message: str, *args: object) -> None:
        self.log(logging.INFO, message, *args)

    def warning(self, message: str, *args: object) -> None:
        self.log(logging.WARNING, message, *args)
