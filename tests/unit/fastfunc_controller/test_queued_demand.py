"""Queued asynchronous requests count as demand: the pure rule, the queue workers' gauge read directly
(several replicas, one down, stale), its wrapping of the gateways' rates, and Prometheus mode's query."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pytest

from fastfunc_controller.metrics_source import (
    GatewayMetrics,
    QueuedDemand,
    QueueWorkers,
    check_queue_worker_url,
    pending_counts,
)
from fastfunc_controller.prometheus_source import PrometheusRates, pending_query, rate_query
from fastfunc_controller.rates import QUEUE_PENDING, Rates, pending_of, with_pending
from fastgshare.autoscaling import EPSILON_RPS
from fastgshare_queue.metrics import PENDING, QueueMetrics

FN = "resnet.fn"


def test_pending_requests_add_the_rate_that_drains_them_within_the_long_window() -> None:
    assert with_pending(Rates(long=4, short=6), 20, 10) == Rates(long=6, short=8)
    # nothing arrives at the gateways, one request waits: a rate above the one that plans no pod
    woken = with_pending(Rates(long=0, short=0), 1, 10)
    assert woken == Rates(long=0.1, short=0.1)
    assert woken.long > EPSILON_RPS
    for nothing in (0.0, -3.0, math.nan, math.inf):
        assert with_pending(Rates(long=4, short=6), nothing, 10) == Rates(long=4, short=6)


def test_worker_replicas_report_the_same_stream_so_the_largest_count_is_taken() -> None:
    assert pending_of([{FN: 5.0}, {FN: 7.0, "b.fn": 1.0}], FN) == 7.0
    assert pending_of([{"b.fn": 1.0}], FN) == 0.0
    assert pending_of([], FN) == 0.0


def test_the_gauge_is_read_from_the_workers_exposition() -> None:
    assert QUEUE_PENDING == PENDING  # the name the worker exports
    metrics = QueueMetrics()
    metrics.set_pending({FN: 3, "bert.fn": 0})
    metrics.retry(FN)
    assert pending_counts(metrics.exposition().decode()) == {FN: 3.0, "bert.fn": 0.0}
    assert check_queue_worker_url("http://127.0.0.1:8081") is None
    assert check_queue_worker_url("worker:8081") == (
        "--queue-worker-url 'worker:8081' is not a URL; allowed: http[s]://HOST[:PORT][/path] (a queue worker's "
        "/metrics, e.g. http://127.0.0.1:8081)")


def test_direct_mode_adds_the_queued_requests_and_a_silent_worker_adds_none() -> None:
    clock = [0.0]
    arrivals = [0.0]
    pending = {"http://10.0.0.7:8081/metrics": 0.0, "http://10.0.0.9:8081/metrics": 0.0}
    down: set[str] = set()

    def get(url: str) -> str:
        if url in down:
            raise OSError("connection refused")
        if url in pending:
            return f'{PENDING}{{function_name="{FN}"}} {pending[url]}\n'
        return f'gateway_function_invocation_started_total{{function_name="{FN}"}} {arrivals[0]}\n'

    gateways = GatewayMetrics(["http://127.0.0.1:8080"], clock=lambda: clock[0], get=get)
    workers = QueueWorkers(["http://queue-workers.fastgshare-system.svc:8081"], clock=lambda: clock[0], get=get,
                           resolve=lambda host: ["10.0.0.9", "10.0.0.7"])
    source = QueuedDemand(gateways, workers)
    source.scrape()
    assert "have not been read twice" in str(source.read(FN, 10, 2))  # the gateways' reason is kept
    for _ in range(3):
        clock[0] += 1
        source.scrape()
    assert source.read(FN, 10, 2) == Rates(long=0, short=0)

    # 30 requests queued while the function is at zero: one replica has not read the stream yet
    pending["http://10.0.0.7:8081/metrics"] = 30
    pending["http://10.0.0.9:8081/metrics"] = 29
    clock[0] += 1
    source.scrape()
    assert source.read(FN, 10, 2) == Rates(long=pytest.approx(3), short=pytest.approx(3))
    assert source.read("other.fn", 10, 2) == Rates(long=0, short=0)

    # the gateways count 5 req/s of synchronous calls besides
    for _ in range(3):
        clock[0] += 1
        arrivals[0] += 5
        source.scrape()
    assert source.read(FN, 10, 2) == Rates(long=pytest.approx(3 + 5 * 3 / 7), short=pytest.approx(3 + 5))

    # a replica that falls silent counts with its last answer for STALE_S (10 s), then the others' count
    down.add("http://10.0.0.7:8081/metrics")
    clock[0] += 1
    source.scrape()
    assert source.read(FN, 10, 2) == Rates(long=pytest.approx(3 + 15 / 8), short=pytest.approx(3 + 5 / 2))
    clock[0] += 10
    source.scrape()
    assert source.read(FN, 10, 2) == Rates(long=pytest.approx(2.9), short=pytest.approx(2.9))
    # every replica silent past STALE_S: no queued requests, the gateways' rates as they are
    down.add("http://10.0.0.9:8081/metrics")
    for _ in range(12):
        clock[0] += 1
        arrivals[0] += 5
        source.scrape()
    assert source.read(FN, 10, 2) == Rates(long=pytest.approx(5), short=pytest.approx(5))


class FakePrometheus:
    def __init__(self) -> None:
        self.answers: dict[str, Mapping[str, Any]] = {}

    def __call__(self, url: str, expr: str) -> Mapping[str, Any]:
        return self.answers.get(expr, {"status": "success", "data": {"resultType": "vector", "result": []}})


def vector(value: str) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [0, value]}]}}


def test_prometheus_mode_asks_for_the_largest_gauge_and_adds_it() -> None:
    assert pending_query(FN) == 'max(fastgshare_queue_pending{function_name="resnet.fn"})'
    prometheus = FakePrometheus()
    source = PrometheusRates("http://p:9090", get=prometheus)
    prometheus.answers["count(gateway_function_invocation_started_total)"] = vector("1")
    source.scrape()
    assert source.read(FN, 10, 2) == Rates(long=0, short=0)  # no queue worker series: nothing queued
    prometheus.answers[pending_query(FN)] = vector("12")
    prometheus.answers[rate_query(FN, 10)] = vector("4")
    assert source.read(FN, 10, 2) == Rates(long=pytest.approx(5.2), short=pytest.approx(1.2))
