"""The extender's Prometheus metrics, in a registry of their own (one per app, none global).

- ``fastgshare_extender_request_duration_seconds{verb}``: latency of every endpoint;
- ``fastgshare_extender_decisions_total{verb,result}``: filter verdicts per node (passed,
  outscored: fits but another node scored higher, failed, unresolvable), prioritize answers,
  binds (bound, refused, failed);
- ``fastgshare_extender_failures_total{verb,reason}``: why nodes were rejected, binds refused
  or requests turned away (a small fixed set of reasons, never free text);
- ``fastgshare_extender_bind_turn_wait_seconds``: how long binds waited for their node's turn;
- ``fastgshare_extender_cache_nodes`` and ``..._cache_pods``: what the cache holds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    """Every metric the extender exports."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.request_seconds = Histogram(
            "fastgshare_extender_request_duration_seconds", "Time to answer a request, by endpoint",
            ["verb"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.decisions = Counter(
            "fastgshare_extender_decisions_total", "Filter verdicts per node, prioritize answers and binds, by result",
            ["verb", "result"], registry=self.registry)
        self.failures = Counter(
            "fastgshare_extender_failures_total", "Rejected nodes, refused binds and turned-away requests, by reason",
            ["verb", "reason"], registry=self.registry)
        self.bind_turn_wait = Histogram(
            "fastgshare_extender_bind_turn_wait_seconds",
            "Time a bind waited for its node's turn (the previous pod's allocation)",
            buckets=WAIT_BUCKETS, registry=self.registry)
        self._cache_nodes = Gauge("fastgshare_extender_cache_nodes", "Nodes in the extender's cache",
                                  registry=self.registry)
        self._cache_pods = Gauge("fastgshare_extender_cache_pods",
                                 "Pods holding a GPU share in the extender's cache (incl. binds in flight)",
                                 registry=self.registry)

    def follow_cache(self, sizes: Callable[[], tuple[int, int]]) -> None:
        """Read the cache sizes (nodes, pods) at every scrape."""
        self._cache_nodes.set_function(lambda: sizes()[0])
        self._cache_pods.set_function(lambda: sizes()[1])

    def count(self, verb: str, results: Mapping[str, int]) -> None:
        for result, amount in results.items():
            if amount:
                self.decisions.labels(verb, result).inc(amount)

    def fail(self, verb: str, reasons: Mapping[str, int]) -> None:
        for reason, amount in reasons.items():
            if amount:
                self.failures.labels(verb, reason).inc(amount)

    def exposition(self) -> tuple[bytes, str]:
        """The text format and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
