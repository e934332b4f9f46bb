"""The queue worker's Prometheus metrics, in a registry of its own (names in :mod:`fastgshare_queue`).

``function_name`` is ``<fn>.<namespace>``, as in the gateway's metrics. ``fastgshare_queue_pending`` is the
stream's own count per function (every worker replica reports the same number: take the max, not the sum).
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST
PENDING = "fastgshare_queue_pending"


class QueueMetrics:
    """The :class:`~fastgshare_queue.worker.Counters` port, plus the queue depth."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        labels = ["function_name"]
        self._pending = Gauge(PENDING, "Async requests stored and not yet acknowledged (waiting or running)",
                              labels, registry=self.registry)
        self._inflight = Gauge("fastgshare_queue_inflight", "Calls this worker has in progress", labels,
                               registry=self.registry)
        self._retries = Counter("fastgshare_queue_retries", "Calls made again after 429, 5xx or no gateway",
                                labels, registry=self.registry)
        self._failures = Counter("fastgshare_queue_failures", "Calls still failing after --max-retries", labels,
                                 registry=self.registry)
        self._callback_failures = Counter("fastgshare_queue_callback_failures",
                                          "Callbacks given up after --max-retries", labels, registry=self.registry)
        self._duplicates = Counter("fastgshare_queue_duplicates",
                                   "Deliveries of a call this worker had completed (acknowledged, not run)",
                                   labels, registry=self.registry)
        self._redeliveries = Counter("fastgshare_queue_redeliveries", "Deliveries after a message's first",
                                     labels, registry=self.registry)
        self._completed = Counter("fastgshare_queue_completed", "Calls completed, by the function's status",
                                  ["function_name", "code"], registry=self.registry)
        self._malformed = Counter("fastgshare_queue_malformed", "Messages that were no async request (dropped)",
                                  registry=self.registry)
        self._known: set[str] = set()

    def set_pending(self, depths: Mapping[str, int]) -> None:
        """The stream's counts; functions no longer in it go to 0."""
        for function in self._known - set(depths):
            self._pending.labels(function).set(0)
        for function, count in depths.items():
            self._pending.labels(function).set(count)
        self._known |= set(depths)

    def inflight(self, function: str, delta: int) -> None:
        self._inflight.labels(function).inc(delta)

    def retry(self, function: str) -> None:
        self._retries.labels(function).inc()

    def failure(self, function: str) -> None:
        self._failures.labels(function).inc()

    def callback_failure(self, function: str) -> None:
        self._callback_failures.labels(function).inc()

    def duplicate(self, function: str) -> None:
        self._duplicates.labels(function).inc()

    def redelivery(self, function: str) -> None:
        self._redeliveries.labels(function).inc()

    def completed(self, function: str, status: int) -> None:
        self._completed.labels(function, str(status)).inc()

    def malformed(self) -> None:
        self._malformed.inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
