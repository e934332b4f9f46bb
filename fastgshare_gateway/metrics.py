"""The gateway's Prometheus metrics, in a registry of its own.

OpenFaaS's gateway names and labels (``openfaas/faas:gateway/metrics/metrics.go``), ``function_name`` being
``<fn>.<namespace>``, so the reference autoscalers' PromQL works unchanged:
``gateway_function_invocation_total{function_name, code}`` and ``gateway_functions_seconds{function_name,
code}`` once per completed invocation, ``gateway_function_invocation_started{function_name}`` once per
invocation started, ``gateway_service_count{function_name}`` the function's ready pods as the gateway sees
them. Ours: ``fastgshare_gateway_queue_depth`` and ``fastgshare_gateway_inflight`` per function, and
``fastgshare_gateway_parked_pods{function_name}`` (ready pods parked: time quota 0/0, woken by the first
request), ``fastgshare_gateway_wakeups_total{function_name}`` (parked pods woken by this gateway), and
``fastgshare_gateway_slo_violations_total{function_name}``: invocations that took longer than the FaSTFunc's
``spec.slo.latencyMs`` (when it has one), and every 5xx (a queue or cold-start timeout is a 503) and 429
(:func:`slo_violated`).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST


def function_label(name: str, namespace: str) -> str:
    return f"{name}.{namespace}"


def slo_violated(code: int, seconds: float, slo_s: float | None) -> bool:
    """An invocation answered ``code`` after ``seconds`` missed the SLO: a 5xx or 429 always, any other
    answer (a client that left included) when it took longer than ``slo_s`` (None: no latency SLO)."""
    return code >= 500 or code == 429 or (slo_s is not None and seconds > slo_s)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.invocations = Counter("gateway_function_invocation", "Invocations completed, by status code",
                                   ["function_name", "code"], registry=self.registry)
        self.seconds = Histogram("gateway_functions_seconds", "Invocation time taken, by status code",
                                 ["function_name", "code"], registry=self.registry)
        self.started = Counter("gateway_function_invocation_started", "Invocations started",
                               ["function_name"], registry=self.registry)
        self.service_count = Gauge("gateway_service_count", "Ready pods of the function",
                                   ["function_name"], registry=self.registry)
        self.queue_depth = Gauge("fastgshare_gateway_queue_depth", "Requests waiting for a pod",
                                 ["function_name"], registry=self.registry)
        self.inflight = Gauge("fastgshare_gateway_inflight", "Requests sent to the function's pods, unanswered",
                              ["function_name"], registry=self.registry)
        self.parked = Gauge("fastgshare_gateway_parked_pods", "Ready pods of the function that are parked "
                            "(time quota 0/0, GPU memory held)", ["function_name"], registry=self.registry)
        self.wakeups = Counter("fastgshare_gateway_wakeups", "Parked pods of the function woken by this gateway",
                               ["function_name"], registry=self.registry)
        self.slo_violations = Counter("fastgshare_gateway_slo_violations",
                                      "Invocations slower than the function's SLO latency, and every 5xx and 429",
                                      ["function_name"], registry=self.registry)
        self._counts: dict[str, float] = {}

    def invocation_started(self, function: str) -> None:
        self.started.labels(function).inc()
        self.slo_violations.labels(function)  # the series exists (at 0) from the first invocation on

    def invocation_done(self, function: str, code: int, seconds: float, slo_s: float | None = None) -> None:
        """One completed invocation; ``slo_s`` the function's SLO latency (None: it has none)."""
        self.invocations.labels(function, str(code)).inc()
        if slo_violated(code, seconds, slo_s):
            self.slo_violations.labels(function).inc()
        self.seconds.labels(function, str(code)).observe(seconds)
        self._counts[function] = self._counts.get(function, 0) + 1

    def invocation_count(self, function: str) -> float:
        """What ``GET /system/functions`` reports as ``invocationCount`` (this gateway's own count)."""
        return self._counts.get(function, 0)

    def load(self, function: str, *, queued: int, inflight: int, ready: int, parked: int = 0) -> None:
        """``ready``: pods that serve (parked ones not counted); ``parked``: ready pods parked."""
        self.queue_depth.labels(function).set(queued)
        self.inflight.labels(function).set(inflight)
        self.service_count.labels(function).set(ready)
        self.parked.labels(function).set(parked)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
