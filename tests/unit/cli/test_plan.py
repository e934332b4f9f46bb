"""``fastgshare plan``: the example profile's plan as a table and as JSON, and one clear line for
each thing that stops it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fastgshare_cli.main import main

REPO = Path(__file__).resolve().parents[3]
PROFILE = REPO / "examples" / "profile-resnet50.json"


def test_the_json_plan_covers_the_demand_with_slo_feasible_configurations(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--profile", str(PROFILE), "--rps", "95", "-o", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["capacityRps"] >= 95
    assert {c["config"] for c in result["configs"]} <= {"q100-s100", "q60-s50", "q40-s24", "q40-s12"}  # not q20-*
    assert set(result["configs"][0]) >= {"quotaRequest", "smPartition", "memoryBytes", "replicas", "sloRps"}
    assert result["cost"] == pytest.approx(sum(c["cost"] * c["replicas"] for c in result["configs"]))


def test_the_area_cost_prefers_the_smallest_sm_slice(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--profile", str(PROFILE), "--rps", "95", "--cost", "area", "-o", "json"]) == 0
    assert [c["config"] for c in json.loads(capsys.readouterr().out)["configs"]] == ["q40-s12"]


def test_the_table_names_the_slo_and_the_total(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--profile", str(PROFILE), "--rps", "95"]) == 0
    out = capsys.readouterr().out
    assert "95 req/s within p95 <= 69 ms on V100-16GB" in out
    assert "total" in out


@pytest.mark.parametrize(("args", "message"), [
    (["--rps", "5", "--slo-ms", "20"], "no configuration of the profile meets the SLO at any load"),
    (["--rps", "5", "--gpu", "K80"], 'GPU model "K80" is unknown'),
    (["--rps", "-1"], "demand must be a finite number of requests per second >= 0, got -1.0"),
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
