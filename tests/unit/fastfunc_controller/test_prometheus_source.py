"""Prometheus mode's rate source: the reference's PromQL, Prometheus's answers, and why there is no rate."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from fastfunc_controller.prometheus_source import (
    PRESENCE_QUERY,
    PrometheusRates,
    QueryError,
    check_prometheus_url,
    duration,
    parse_vector,
    pending_query,
    query_url,
    rate_query,
    window_s,
)
from fastfunc_controller.rates import Rates

FN = "fn.ns"


def vector(*values: str) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": "vector",
                                          "result": [{"metric": {}, "value": [1.5, v]} for v in values]}}


def test_the_query_is_the_references_promql_summed_over_the_gateways() -> None:
    counter = "gateway_function_invocation_started_total"
    assert rate_query(FN, 10) == f'sum(rate({counter}{{function_name="fn.ns"}}[10s]))'
    assert rate_query(FN, 2.5) == f'sum(rate({counter}{{function_name="fn.ns"}}[2500ms]))'
    assert rate_query('a"b\\c', 2) == f'sum(rate({counter}{{function_name="a\\"b\\\\c"}}[2s]))'
    assert (duration(15), duration(0.25), duration(1.9999)) == ("15s", "250ms", "2s")


def test_a_window_holds_at_least_two_scrapes() -> None:
    assert window_s(10, 1) == 10
    assert window_s(2, 1) == 2
    assert window_s(2, 5) == 10  # scraped every 5 s, the panic window is 10 s
    assert window_s(10, 0.5) == 10


def test_the_url_is_a_base_url_and_gets_the_query_path() -> None:
    assert query_url("http://p:9090") == "http://p:9090/api/v1/query"
    assert query_url("http://p:9090/") == "http://p:9090/api/v1/query"
    assert query_url("https://p/prometheus/") == "https://p/prometheus/api/v1/query"
    assert check_prometheus_url("http://127.0.0.1:9090") is None
    for bad in ("127.0.0.1:9090", "ftp://p", "http://", "http://p:9090/?x=1"):
        problem = check_prometheus_url(bad)
        assert problem is not None
        assert problem.startswith(f"--prometheus-url {bad!r} is not a Prometheus URL; allowed: http[s]://")


def test_an_answer_is_one_value_none_or_an_error() -> None:
    assert parse_vector(vector("2.5")) == 2.5
    assert parse_vector(vector()) is None
    with pytest.raises(QueryError, match="bad_data: 'parse error'"):
        parse_vector({"status": "error", "errorType": "bad_data", "error": "parse error"})
    with pytest.raises(QueryError, match="not an instant vector"):
        parse_vector({"status": "success", "data": {"resultType": "matrix", "result": []}})
    with pytest.raises(QueryError, match="2 series"):
        parse_vector(vector("1", "2"))
    with pytest.raises(QueryError, match="no number"):
        parse_vector(vector("x"))
    with pytest.raises(QueryError, match="the value is nan"):
        parse_vector(vector("NaN"))


class FakePrometheus:
    def __init__(self) -> None:
        self.answers: dict[str, Mapping[str, Any]] = {PRESENCE_QUERY: vector("3")}
        self.down = False
        self.asked: list[tuple[str, str]] = []

    def __call__(self, url: str, expr: str) -> Mapping[str, Any]:
        self.asked.append((url, expr))
        if self.down:
            raise OSError("[Errno 111] Connection refused")
        return self.answers.get(expr, vector())


def test_the_source_answers_both_windows_and_says_why_it_has_no_rate() -> None:
    clock = [0.0]
    prometheus = FakePrometheus()
    source = PrometheusRates("http://p:9090", clock=lambda: clock[0], get=prometheus)
    assert source.read(FN, 10, 2) == "Prometheus at http://p:9090 has not been asked yet; the current plan is kept"
    source.scrape()
    assert prometheus.asked == [("http://p:9090/api/v1/query", "count(gateway_function_invocation_started_total)")]
    prometheus.answers[rate_query(FN, 10)] = vector("4")
    prometheus.answers[rate_query(FN, 2)] = vector("6.5")
    assert source.read(FN, 10, 2) == Rates(long=4, short=6.5)
    assert source.read("other.ns", 10, 2) == Rates(long=0, short=0)  # no series of its own: never requested

    prometheus.down = True
    source.scrape()
    asked = len(prometheus.asked)
    assert source.read(FN, 10, 2) == ("cannot query Prometheus at http://p:9090 (count(gateway_function_invocation_"
                                      "started_total)): [Errno 111] Connection refused; the current plan is kept")
    assert len(prometheus.asked) == asked  # while it does not answer, a read does not wait for it

    prometheus.down = False
    prometheus.answers[PRESENCE_QUERY] = vector()
    source.scrape()
    why = source.read(FN, 10, 2)
    assert isinstance(why, str)
    assert why.startswith("Prometheus at http://p:9090 holds no gateway_function_invocation_started_total series")

    prometheus.answers[PRESENCE_QUERY] = vector("1")
    source.scrape()
    prometheus.answers[rate_query(FN, 2)] = {"status": "error", "errorType": "timeout", "error": "query timed out"}
    why = source.read(FN, 10, 2)
    assert isinstance(why, str)
    assert why.startswith("cannot query Prometheus at http://p:9090 (sum(rate(")
    assert why.endswith("[2s]))): timeout: 'query timed out'; the current plan is kept")

    clock[0] += 30  # the checks stopped
    assert source.read(FN, 10, 2) == "Prometheus at http://p:9090 was last asked 30 s ago; the current plan is kept"


def test_windows_are_clamped_to_two_scrape_intervals() -> None:
    prometheus = FakePrometheus()
    source = PrometheusRates("http://p:9090", scrape_interval_s=5, get=prometheus)
    source.scrape()
    assert isinstance(source.read(FN, 15, 2), Rates)
    assert [expr for _, expr in prometheus.asked[1:]] == [rate_query(FN, 15), rate_query(FN, 10), pending_query(FN)]
