"""The controller's Prometheus metrics, in a registry of their own; served at ``/metrics`` beside
``/healthz`` on ``--health-address``. The only module of the controller that imports
``prometheus_client``. Names and labels are a contract (docs/observability.md):

- ``fastgshare_controller_reconcile_total{result}``: reconciles by result: ``synced`` (converged or
  converging), ``invalid`` (the FaSTPod cannot be turned into pods), ``gone`` (deleted), ``error``
  (an API call failed; retried with backoff);
- ``fastgshare_controller_reconcile_duration_seconds``: how long one reconcile took;
- ``fastgshare_controller_workqueue_depth``: keys waiting for a worker;
- ``fastgshare_controller_workqueue_wait_seconds``: how long a key waited before a worker took it;
- ``fastgshare_controller_workqueue_retries_total``: keys queued again after a failed reconcile;
- ``fastgshare_controller_fastpods``: FaSTPods in the cache;
- ``fastgshare_controller_fastpod_conditions{condition,status}``: FaSTPods by condition, read from
  their cached status at scrape time;
- ``fastgshare_controller_leader``: 1 while this replica holds the Lease (or runs without election);
- ``fastgshare_controller_last_reconcile_timestamp_seconds``: when the last reconcile finished.
"""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

RESULTS = ("synced", "invalid", "gone", "error")
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
WAIT_BUCKETS = (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0, 300.0)


class ControllerMetrics:
    """Every metric the controller exports; the controller calls :meth:`reconciled`,
    :meth:`retried` and :meth:`queue_waited`, the rest is read at scrape time."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self.registry = CollectorRegistry()
        self._reconciles = Counter("fastgshare_controller_reconcile_total", "Reconciles of a FaSTPod, by result",
                                   ["result"], registry=self.registry)
        for result in RESULTS:  # every series exists from the start, so rate() sees the first one
            self._reconciles.labels(result)
        self._duration = Histogram("fastgshare_controller_reconcile_duration_seconds",
                                   "Time one reconcile of a FaSTPod took", buckets=DURATION_BUCKETS,
                                   registry=self.registry)
        self._wait = Histogram("fastgshare_controller_workqueue_wait_seconds",
                               "Time a FaSTPod key waited in the work queue before a worker took it",
                               buckets=WAIT_BUCKETS, registry=self.registry)
        self._retries = Counter("fastgshare_controller_workqueue_retries", "Keys queued again after a failed "
                                "reconcile", registry=self.registry)
        self._depth = Gauge("fastgshare_controller_workqueue_depth", "FaSTPod keys waiting for a worker",
                            registry=self.registry)
        self._leader = Gauge("fastgshare_controller_leader",
                             "1 while this replica holds the leader Lease (or runs without leader election)",
                             registry=self.registry)
        self._last = Gauge("fastgshare_controller_last_reconcile_timestamp_seconds",
                           "Unix time the last reconcile finished (0: none yet)", registry=self.registry)

    # --- fed by the controller -------------------------------------------------------------------
    def reconciled(self, result: str, seconds: float) -> None:
        self._reconciles.labels(result).inc()
        self._duration.observe(seconds)
        self._last.set(self._clock())

    def retried(self) -> None:
        self._retries.inc()

    def queue_waited(self, seconds: float) -> None:
        self._wait.observe(seconds)

    # --- read at scrape time ----------------------------------------------------------------------
    def follow(self, *, depth: Callable[[], int], leader: Callable[[], bool],
               fastpods: Callable[[], Iterable[Mapping[str, Any]]]) -> None:
        self._depth.set_function(depth)
        self._leader.set_function(lambda: 1.0 if leader() else 0.0)
        self.registry.register(_FaSTPodCollector(fastpods))

    def exposition(self) -> tuple[bytes, str]:
        """The text format and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _FaSTPodCollector:
    """FaSTPods in the cache, and how many have each condition in each status."""

    def __init__(self, fastpods: Callable[[], Iterable[Mapping[str, Any]]]) -> None:
        self._fastpods = fastpods

    def describe(self) -> list[Metric]:
        return []  # built at scrape time only

    def collect(self) -> Iterator[Metric]:
        objects = list(self._fastpods())
        total = GaugeMetricFamily("fastgshare_controller_fastpods", "FaSTPods in the controller's cache")
        total.add_metric([], len(objects))
        yield total
        tally = Tally((str(condition.get("type", "")), str(condition.get("status", "")))
                      for fastpod in objects
                      for condition in ((fastpod.get("status") or {}).get("conditions") or []))
        conditions = GaugeMetricFamily("fastgshare_controller_fastpod_conditions",
                                       "FaSTPods by condition type and status", labels=["condition", "status"])
        for (kind, status), count in sorted(tally.items()):
            conditions.add_metric([kind, status], count)
        yield conditions
