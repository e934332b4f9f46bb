"""The work queue of the services' controllers: deduplicating, with delayed and rate-limited adds
(client-go's workqueue). Both controllers (FaSTPods, FaSTFuncs) take their keys from it.

- A key added many times before a worker takes it is processed once (``dirty`` set).
- A key is never processed by two workers at once: one added while it is being processed is
  queued again when the worker calls :meth:`WorkQueue.done` (``processing`` set).
- :meth:`WorkQueue.add_rate_limited` retries a failing key after an exponential per-key delay
  (``base_delay_s * 2**failures``, capped at ``max_delay_s``); :meth:`WorkQueue.forget` resets it
  after a success. :meth:`WorkQueue.add_after` schedules a key for later.
- :meth:`WorkQueue.shut_down` wakes every waiting worker; :meth:`WorkQueue.get` then returns ``None``.
- Its metrics go to an ``observer`` (:class:`QueueObserver`, optional): for every key a worker
  takes, how long it waited since it was queued (the queue's latency), and every rate-limited
  retry; its depth is ``len(queue)``. The FaSTPod controller exports them as
  ``fastgshare_controller_workqueue_*`` (fastpod_crd_controller/metrics.py).

The clock is injected for tests.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

DEFAULT_BASE_DELAY_S = 0.005
DEFAULT_MAX_DELAY_S = 300.0


class QueueObserver(Protocol):
    """Hears the work queue's metrics."""

    def queue_waited(self, seconds: float) -> None:
        """A worker took a key that had waited ``seconds`` since it was queued."""
        ...

    def retried(self) -> None:
        """A key was queued again after a failure (:meth:`WorkQueue.add_rate_limited`)."""
        ...


class WorkQueue:
    """Keys (``namespace/name``) waiting for a worker."""

    def __init__(self, *, base_delay_s: float = DEFAULT_BASE_DELAY_S, max_delay_s: float = DEFAULT_MAX_DELAY_S,
                 clock: Callable[[], float] = time.monotonic,
                 observer: QueueObserver | None = None) -> None:
        self._base_delay_s = base_delay_s
        self._max_delay_s = max_delay_s
        self._clock = clock
        self._cond = threading.Condition()
        self._queue: deque[str] = deque()
        self._dirty: set[str] = set()
        self._processing: set[str] = set()
        self._delayed: list[tuple[float, int, str]] = []  # (due, tie-breaker, key), a heap
        self._sequence = itertools.count()
        self._failures: dict[str, int] = {}
        self._shutting_down = False
        self._queued_at: dict[str, float] = {}
        self._observer = observer

    def add(self, key: str) -> None:
        with self._cond:
            self._add_locked(key)

    def add_after(self, key: str, delay_s: float) -> None:
        if delay_s <= 0:
            self.add(key)
            return
        with self._cond:
            if self._shutting_down:
                return
            heapq.heappush(self._delayed, (self._clock() + delay_s, next(self._sequence), key))
            self._cond.notify()

    def add_rate_limited(self, key: str) -> float:
        """Queue ``key`` after its backoff delay, and return that delay."""
        with self._cond:
            failures = self._failures.get(key, 0)
            self._failures[key] = failures + 1
        delay = min(self._base_delay_s * 2 ** min(failures, 62), self._max_delay_s)
        if self._observer is not None:
            self._observer.retried()
        self.add_after(key, delay)
        return delay

    def forget(self, key: str) -> None:
        """Stop tracking ``key``'s failures (call after it was processed successfully)."""
        with self._cond:
            self._failures.pop(key, None)

    def failures(self, key: str) -> int:
        with self._cond:
            return self._failures.get(key, 0)

    def get(self, timeout_s: float | None = None) -> str | None:
        """The next key, marked as processing; ``None`` on shutdown or after ``timeout_s``."""
        deadline = None if timeout_s is None else self._clock() + timeout_s
        with self._cond:
            while True:
                self._promote_due()
                if self._queue:
                    key = self._queue.popleft()
                    self._dirty.discard(key)
                    self._processing.add(key)
                    waited = self._clock() - self._queued_at.pop(key, self._clock())
                    if self._observer is not None:
                        self._observer.queue_waited(max(0.0, waited))
                    return key
                if self._shutting_down:
                    return None
                wait = self._wait_time(deadline)
                if wait is not None and wait <= 0:
                    return None
                self._cond.wait(wait)

    def done(self, key: str) -> None:
        """The worker finished ``key``; if it was added meanwhile, it is queued again."""
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty:
                self._queue.append(key)
                self._cond.notify()

    def shut_down(self) -> None:
        with self._cond:
            self._shutting_down = True
            self._delayed.clear()
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._queue)

    def _add_locked(self, key: str) -> None:
        if self._shutting_down or key in self._dirty:
            return
        self._dirty.add(key)
        self._queued_at.setdefault(key, self._clock())
        if key not in self._processing:
            self._queue.append(key)
            self._cond.notify()

    def _promote_due(self) -> None:
        now = self._clock()
        while self._delayed and self._delayed[0][0] <= now:
            self._add_locked(heapq.heappop(self._delayed)[2])

    def _wait_time(self, deadline: float | None) -> float | None:
        """How long to sleep: until the next delayed key or the deadline, whichever is first."""
        candidates = [t - self._clock() for t in (deadline, self._delayed[0][0] if self._delayed else None)
                      if t is not None]
        return min(candidates) if candidates else None
