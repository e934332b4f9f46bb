"""Request rates from the gateways' counters: differentiation, resets, several gateways, and the
metrics source's parsing and its reasons for having no rate."""

from __future__ import annotations

import pytest

from fastfunc_controller.metrics_source import NO_GATEWAY, GatewayMetrics, invocation_counts, metrics_url, replica_urls
from fastfunc_controller.rates import Rates, RateTracker

FN = "resnet.fn"


def test_a_counter_becomes_requests_per_second_over_the_window() -> None:
    tracker = RateTracker()
    assert tracker.rate(FN, 10) is None
    for second in range(21):
        tracker.observe(float(second), {"g1": {FN: 5.0 * second}})  # 5 req/s
    assert tracker.rate(FN, 10) == pytest.approx(5)
    assert tracker.rate(FN, 2) == pytest.approx(5)
    assert tracker.rate("other.fn", 10) == 0.0  # never invoked: 0, not unknown


def test_the_short_window_sees_a_burst_the_long_one_averages() -> None:
    tracker = RateTracker()
    total = 0.0
    for second in range(11):
        total += 40 if second > 8 else 4
        tracker.observe(float(second), {"g1": {FN: total}})
    assert tracker.rates(FN, 10, 2) == Rates(long=pytest.approx(11.2), short=pytest.approx(40))


def test_a_reset_counts_the_new_value_and_gateways_add_up() -> None:
    tracker = RateTracker()
    tracker.observe(0.0, {"g1": {FN: 100.0}, "g2": {FN: 50.0}})  # first sight: baselines, no increase
    tracker.observe(1.0, {"g1": {FN: 110.0}, "g2": {FN: 55.0}})  # +10, +5
    tracker.observe(2.0, {"g1": {FN: 4.0}, "g2": {FN: 60.0}})  # g1 restarted: +4; +5
    tracker.observe(3.0, {"g1": {}, "g2": {FN: 61.0}})  # g1 restarted again, nothing served there yet: +0; +1
    tracker.observe(4.0, {"g1": {FN: 3.0}, "g2": {FN: 61.0}})  # g1's first requests since: +3
    assert tracker.rate(FN, 4) == pytest.approx((15 + 9 + 1 + 3) / 4)
    assert tracker.rate(FN, 1) == pytest.approx(3)


def test_a_gateway_that_does_not_answer_keeps_its_count_until_it_does() -> None:
    tracker = RateTracker()
    tracker.observe(0.0, {"g1": {FN: 0.0}, "g2": {FN: 0.0}})
    tracker.observe(1.0, {"g1": {FN: 10.0}, "g2": None})
    tracker.observe(2.0, {"g1": {FN: 20.0}, "g2": {FN: 20.0}})  # g2's two seconds show now
    assert tracker.rate(FN, 2) == pytest.approx(20)
    tracker.observe(3.0, {"g1": None, "g2": None})  # nobody answered: no round
    assert tracker.last_round_s == 2.0


GATEWAY_TEXT = """# HELP gateway_function_invocation_total Invocations completed, by status code
# TYPE gateway_function_invocation_total counter
gateway_function_invocation_total{code="200",function_name="resnet.fn"} 7.0
gateway_function_invocation_total{code="503",function_name="resnet.fn"} 3.0
gateway_function_invocation_total{code="200",function_name="bert.fn"} 1.0
# HELP gateway_function_invocation_created Invocations completed, by status code
# TYPE gateway_function_invocation_created gauge
gateway_function_invocation_created{code="200",function_name="resnet.fn"} 1.7e+09
# HELP gateway_function_invocation_started_total Invocations started
# TYPE gateway_function_invocation_started_total counter
gateway_function_invocation_started_total{function_name="resnet.fn"} 12.0
"""


def test_the_counts_are_the_arrivals_per_function() -> None:
    # arrivals, not completions: 12 came for resnet (10 answered so far), none counted for bert yet
    assert invocation_counts(GATEWAY_TEXT) == {"resnet.fn": 12.0}
    assert metrics_url("http://127.0.0.1:8080") == "http://127.0.0.1:8080/metrics"
    assert metrics_url("http://gw:8080/") == "http://gw:8080/metrics"
    assert metrics_url("http://gw:9090/custom") == "http://gw:9090/custom"


def test_the_source_scrapes_every_gateway_and_says_why_it_has_no_rate() -> None:
    assert GatewayMetrics([]).read(FN, 10, 2) == NO_GATEWAY
    clock = [0.0]
    counts = {"http://a/metrics": 0, "http://b/metrics": 0}
    down: set[str] = set()

    def get(url: str) -> str:
        if url in down:
            raise OSError("connection refused")
        return f'gateway_function_invocation_started_total{{function_name="{FN}"}} {counts[url]}\n'

    source = GatewayMetrics(["http://a", "http://b/metrics"], clock=lambda: clock[0], get=get)
    source.scrape()
    assert "have not been read twice" in str(source.read(FN, 10, 2))
    for _ in range(4):
        clock[0] += 1
        counts["http://a/metrics"] += 3
        counts["http://b/metrics"] += 1
        source.scrape()
    assert source.read(FN, 10, 2) == Rates(long=pytest.approx(4), short=pytest.approx(4))
    down.update(counts)
    clock[0] += 1
    source.scrape()
    why = source.read(FN, 10, 2)
    assert isinstance(why, str)
    assert why.startswith("no gateway answers: http://a/metrics: connection refused")
    down.clear()
    source.scrape()
    assert isinstance(source.read(FN, 10, 2), Rates)
    clock[0] += 30  # the scraper stopped
    assert "were last read 30 s ago" in str(source.read(FN, 10, 2))


def test_each_replica_behind_a_headless_service_is_read_on_its_own_and_summed() -> None:
    """Through a load-balanced name two gateways' counters would mix; a headless Service's name
    resolves to every replica, and each is scraped by its address."""
    clock = [0.0]
    counts = {"http://10.0.0.7:8080/metrics": 0.0, "http://10.0.0.9:8080/metrics": 0.0}
    asked: list[str] = []

    def get(url: str) -> str:
        asked.append(url)
        return f'gateway_function_invocation_started_total{{function_name="{FN}"}} {counts[url]}\n'

    source = GatewayMetrics(["http://gateways.fastgshare-system.svc:8080"], clock=lambda: clock[0], get=get,
                            resolve=lambda host: ["10.0.0.9", "10.0.0.7"])
    for _ in range(5):
        source.scrape()
        clock[0] += 1
        counts["http://10.0.0.7:8080/metrics"] += 2
        counts["http://10.0.0.9:8080/metrics"] += 5
    source.scrape()
    assert set(asked) == set(counts)
    assert source.read(FN, 5, 2) == Rates(long=pytest.approx(7), short=pytest.approx(7))


def test_a_name_that_does_not_resolve_or_an_address_is_read_as_given() -> None:
    def unresolvable(host: str) -> list[str]:
        raise OSError("Name or service not known")

    assert replica_urls("http://gw:8080/metrics", unresolvable) == ["http://gw:8080/metrics"]
    assert replica_urls("http://127.0.0.1:8080/metrics", unresolvable) == ["http://127.0.0.1:8080/metrics"]
    assert replica_urls("http://gw/metrics", lambda host: ["fd00::1"]) == ["http://[fd00::1]/metrics"]
