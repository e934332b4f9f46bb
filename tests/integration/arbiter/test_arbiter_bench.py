"""``bench/arbiter.py`` in miniature, so the benchmark keeps working: both arbiters, every load, JSON."""

from __future__ import annotations

import json

import pytest

from bench import arbiter as bench


def test_the_benchmark_measures_the_arbiter_and_the_null_arbiter(capsys: pytest.CaptureFixture[str]) -> None:
    bench.main(["--seconds", "0.3"])
    result = json.loads(capsys.readouterr().out)
    loads = [(r["clients"], r.get("interval_ms")) for r in result["results"]]
    assert loads == [(1, None), (8, None), (64, None), (64, 10.0)]
    assert [(r["clients"], r.get("interval_ms")) for r in result["null_arbiter"]] == [(64, None), (64, 10.0)]
    for measured in [*result["results"], *result["null_arbiter"]]:
        assert measured["grants"] > 0
        assert 0 < measured["round_trip_us_p50"] <= measured["round_trip_us_p99"] <= measured["round_trip_us_max"]
    assert result["peak_grants_per_s"] == max(r["grants_per_s"] for r in result["results"][:3])
    assert result["round_trip_us_p99"] == result["results"][3]["round_trip_us_p99"]
    assert result["null_arbiter_peak_grants_per_s"] == result["null_arbiter"][0]["grants_per_s"]
    assert result["null_arbiter_round_trip_us_p99"] == result["null_arbiter"][1]["round_trip_us_p99"]
