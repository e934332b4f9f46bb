"""``bench/controller.py`` in miniature, so the benchmark keeps working: both controllers, JSON figures."""

from __future__ import annotations

import json

import pytest

from bench import controller as bench


def test_the_benchmark_runs_both_controllers_and_reports_the_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--parents", "3", "--replicas", "2", "--no-unthrottled", "--timeout-seconds", "120"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["pods"] == 6
    for phase in ("fastpod_controller", "replicaset_controller"):
        assert result[phase]["seconds_to_all_pods"] > 0
    assert result["ratio_fastpod_to_replicaset"] == pytest.approx(
        result["fastpod_controller"]["seconds_to_all_pods"] / result["replicaset_controller"]["seconds_to_all_pods"],
        rel=0.01)
    assert "rounds" not in result


def test_rounds_report_the_median_ratio_and_its_round(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--parents", "2", "--replicas", "2", "--rounds", "3", "--timeout-seconds", "120"]) == 0
    result = json.loads(capsys.readouterr().out)
    rounds = result["rounds"]
    assert len(rounds) == 3
    assert result["ratio_fastpod_to_replicaset_unthrottled"] == sorted(r["ratio"] for r in rounds)[1]
    median = next(r for r in rounds if r["ratio"] == result["ratio_fastpod_to_replicaset_unthrottled"])
    assert result["fastpod_controller"]["seconds_to_all_pods"] == median["fastpod_s"]
    assert result["replicaset_controller_unthrottled"]["seconds_to_all_pods"] == median["replicaset_unthrottled_s"]
