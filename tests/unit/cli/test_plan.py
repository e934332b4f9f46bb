"""``fastgshare plan``: the example profile's plan as a table and as JSON, and one clear line for
each thing that stops it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fastgshare_cli.main import main

REPO = Path(__file__).resolve().parents[3]
PROFILE = REPO / "examples" / "profile-resnet50.json"
MiB = 2**20


def test_the_json_plan_covers_the_demand_with_slo_feasible_configurations(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--profile", str(PROFILE), "--rps", "95", "-o", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["capacityRps"] >= 95
    assert {c["config"] for c in result["configs"]} <= {"q100-s100", "q60-s50", "q40-s24", "q40-s12"}  # not q20-*
    assert set(result["configs"][0]) >= {"quotaRequest", "smPartition", "memoryBytes", "replicas", "sloRps"}
    assert result["cost"] == pytest.approx(sum(c["cost"] * c["replicas"] for c in result["configs"]), abs=1e-5)
    assert result["contextReserveBytes"] == 320 * MiB  # a V100's CUDA context reserve (auto), as the agent's


def test_each_pod_is_planned_with_its_context_reserve(capsys: pytest.CaptureFixture[str]) -> None:
    """The profile's pods take 2 GiB; on a 2.4 GB GPU they fit alone, not with a 300 MiB context each."""
    gpu = ["--gpu", "2400000000:80sm"]
    assert main(["plan", "--profile", str(PROFILE), "--rps", "95", *gpu, "--context-reserve", "0", "-o", "json"]) == 0
    bare = json.loads(capsys.readouterr().out)
    assert bare["configs"]
    assert bare["contextReserveBytes"] == 0
    assert main(["plan", "--profile", str(PROFILE), "--rps", "95", *gpu, "--context-reserve", "300Mi"]) == 1
    assert "fits the GPU's memory with a 300 MiB context reserve per pod (--context-reserve)" in capsys.readouterr().err


def test_the_reserve_raises_the_memory_part_of_a_pods_cost(capsys: pytest.CaptureFixture[str]) -> None:
    costs = []
    for reserve in ("0", "4Gi"):
        assert main(["plan", "--profile", str(PROFILE), "--rps", "95", "--context-reserve", reserve, "-o", "json"]) == 0
        costs.append({c["config"]: c["cost"] for c in json.loads(capsys.readouterr().out)["configs"]})
    assert all(cost >= (2 + 4) / 16 for cost in costs[1].values()), costs  # 6 GiB of a 16 GiB GPU at least
    assert min(costs[0].values()) < (2 + 4) / 16, costs


def test_the_area_cost_prefers_the_smallest_sm_slice(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--profile", str(PROFILE), "--rps", "95", "--cost", "area", "-o", "json"]) == 0
    assert [c["config"] for c in json.loads(capsys.readouterr().out)["configs"]] == ["q40-s12"]


def test_the_table_names_the_slo_and_the_total(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--profile", str(PROFILE), "--rps", "95"]) == 0
    out = capsys.readouterr().out
    assert "95 req/s within p95 <= 69 ms on V100-16GB (dominant cost, 320 MiB context reserve per pod)" in out
    assert "total" in out


@pytest.mark.parametrize(("args", "message"), [
    (["--rps", "5", "--slo-ms", "20"], "no configuration of the profile meets the SLO at any load"),
    (["--rps", "5", "--gpu", "K80"], 'GPU model "K80" is unknown'),
    (["--rps", "-1"], "demand must be a finite number of requests per second >= 0, got -1.0"),
    (["--rps", "5", "--context-reserve", "lots"], "--context-reserve 'lots' is not allowed: expected a byte quantity"),
    (["--rps", "5", "--context-reserve", "16Gi"], "--context-reserve 16 GiB is not allowed for V100-16GB (16 GiB)"),
])
def test_what_stops_a_plan_is_one_line(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--profile", str(PROFILE), *args]) == 1
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1


def test_a_missing_or_broken_profile_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--profile", str(tmp_path / "none.json"), "--rps", "5"]) == 2
    assert "none.json: cannot be read: No such file or directory" in capsys.readouterr().err
    broken = tmp_path / "broken.json"
    broken.write_text('{"version": 1, "function": "f", "points": [{"quotaRequest": 2}]}')
    assert main(["plan", "--profile", str(broken), "--rps", "5"]) == 1
    assert "profile.points[0].smPartition: is missing" in capsys.readouterr().err


def test_a_shared_model_is_held_once_per_gpu_of_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    """With --model-bytes the profile's 2 GiB are each pod's own memory; the weights take their
    bytes once on every GPU the plan uses."""
    args = ["plan", "--profile", str(PROFILE), "--rps", "95", "--context-reserve", "0", "-o", "json"]
    assert main(args) == 0
    alone = json.loads(capsys.readouterr().out)
    assert alone["modelBytes"] == 0
    assert alone["memoryBytes"] == sum(c["memoryBytes"] * c["replicas"] for c in alone["configs"])
    assert main([*args, "--model-bytes", "8Gi"]) == 0
    shared = json.loads(capsys.readouterr().out)
    assert shared["modelBytes"] == 8 * 2**30
    pods = sum(c["memoryBytes"] * c["replicas"] for c in shared["configs"])
    assert shared["gpus"] >= 1
    assert shared["memoryBytes"] == pods + shared["gpus"] * 8 * 2**30
    # each pod's memory share is of the 8 GiB the weights leave: at least 2 / 8 of a GPU
    assert all(c["cost"] >= 2 / 8 - 1e-6 for c in shared["configs"])


@pytest.mark.parametrize(("model", "message"), [
    ("lots", "--model-bytes 'lots' is not allowed; allowed: a positive whole number of bytes"),
    ("16Gi", "--model-bytes 16 GiB is not allowed for V100-16GB (16 GiB)"),
    ("15Gi", "fits the GPU's memory next to the model's 15 GiB (--model-bytes)"),
])
def test_a_model_that_leaves_no_room_is_one_line(model: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--profile", str(PROFILE), "--rps", "5", "--model-bytes", model]) == 1
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1
