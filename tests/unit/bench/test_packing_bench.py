"""The packing benchmark's own pieces: the exact schedulability test, baselines, output."""

from __future__ import annotations

import pytest

from bench import packing
from bench.schedulability import minimum_window, servable
from bench.workloads import paper_workload, random_workload, share
from fastgshare.gpu_models import gpu_model_spec

GiB = 2**30


@pytest.mark.parametrize(
    ("shares", "window"),
    [
        pytest.param([], 0.0, id="nothing"),
        pytest.param([share(0, 100, GiB)], 0.0, id="best-effort-needs-no-time"),
        pytest.param([share(1000, 100, GiB)], 1.0, id="whole-gpu"),
        pytest.param([share(600, 60, GiB)] * 2, 1.2, id="two-60-60-must-take-turns"),
        pytest.param([share(500, 40, GiB)] * 3, 0.75, id="pairs-run-together"),
        pytest.param([share(300, 34, GiB)] * 3, 0.45, id="three-34-percent"),
        pytest.param([s for _, s in paper_workload()], 1.0, id="paper-mix-exactly-fills"),
    ],
)
def test_minimum_window_is_exact(shares: list, window: float) -> None:
    assert minimum_window(shares) == pytest.approx(window, abs=1e-6)


def test_original_rule_admits_sets_no_schedule_can_serve() -> None:
    pods = [("a", share(600, 60, GiB)), ("b", share(600, 60, GiB))]
    gpus = packing.original_rule(pods, gpu_model_spec("V100-16GB"))
    assert len(gpus) == 1  # 0.6*0.6 + 0.6*0.6 = 0.72 <= 1
    assert not servable(gpus[0])


def test_lower_bound_takes_the_larger_of_area_and_memory() -> None:
    gpu = gpu_model_spec("T4")
    assert packing.lower_bound([("a", share(500, 100, 10 * GiB))] * 3, gpu) == 2  # memory: 30/16
    assert packing.lower_bound([("a", share(900, 100, GiB))] * 3, gpu) == 3  # area: 2.7


def test_random_workloads_are_seeded() -> None:
    assert random_workload(50, 7) == random_workload(50, 7)
    assert random_workload(50, 7) != random_workload(50, 8)


def test_measure_reports_every_method(capsys: pytest.CaptureFixture[str]) -> None:
    result = packing.measure("paper-mix", paper_workload(), gpu_model_spec("V100-16GB"))
    assert (result["ours_offline"], result["lower_bound"], result["one_pod_per_gpu"]) == (1, 1, 8)
    assert result["ours_unservable"] == 0
