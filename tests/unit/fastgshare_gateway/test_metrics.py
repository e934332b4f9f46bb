"""Which invocations count as SLO violations."""

from __future__ import annotations

import pytest

from fastgshare_gateway.metrics import GatewayMetrics, slo_violated


@pytest.mark.parametrize(("code", "seconds", "slo_s", "violated"), [
    (200, 0.1, 0.2, False),
    (200, 0.3, 0.2, True),  # slower than the SLO
    (201, 5.0, None, False),  # no latency SLO
    (404, 0.3, 0.2, True),
    (499, 0.3, 0.2, True),  # the client left after the SLO had passed
    (499, 0.1, 0.2, False),
    (429, 0.0, None, True),
    (502, 0.0, None, True),
    (503, 0.0, 10.0, True),  # a queue timeout
    (504, 0.0, None, True),
])
def test_slow_answers_5xx_and_429_violate_the_slo(code: int, seconds: float, slo_s: float | None,
                                                  violated: bool) -> None:
    assert slo_violated(code, seconds, slo_s) is violated


def test_the_counter_counts_violations_per_function() -> None:
    metrics = GatewayMetrics()
    metrics.invocation_started("fn.ns")
    metrics.invocation_done("fn.ns", 200, 0.01, 0.2)
    assert metrics.registry.get_sample_value("fastgshare_gateway_slo_violations_total", {"function_name": "fn.ns"}) == 0
    metrics.invocation_done("fn.ns", 200, 0.5, 0.2)
    metrics.invocation_done("fn.ns", 503, 0.01, None)
    assert metrics.registry.get_sample_value("fastgshare_gateway_slo_violations_total", {"function_name": "fn.ns"}) == 2
