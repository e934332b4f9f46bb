"""The autoscaling simulation's CI subset: one ramp period, a reduced fleet and a tiny trace file in
the Azure Functions schema; deterministic, and only structure and invariants are asserted here (the
issue's targets are the full bench's, reported there)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import fastgshare.autoscaling
from bench import autoscale_sim
from bench.autoscale_sim import POLICIES, PROFILE, fleet, load_azure_trace, main, simulate, simulate_fleet
from fastgshare.profile import decode_profile

PROFILE_DOC = decode_profile(PROFILE.read_text())


def test_one_ramp_period_is_deterministic_and_rpr_beats_time_sharing() -> None:
    first = simulate(PROFILE_DOC, "ramp", 180, seed=3)
    assert simulate(PROFILE_DOC, "ramp", 180, seed=3) == first
    rpr, time_sharing, hpa = first["rpr"], first["time_sharing_only"], first["hpa_whole_gpu"]
    assert rpr["requests"] == time_sharing["requests"] == hpa["requests"] > 10_000  # type: ignore[index]
    assert rpr["slo_violations_pct_after_first_cold_start"] <= 2.0  # type: ignore[index]  # the bench reports the rest
    assert rpr["gpu_seconds"] < time_sharing["gpu_seconds"]  # type: ignore[index]
    assert first["slo_capacity_rps"]["q20-s6"] == 0  # type: ignore[index]  # 74 ms a request: never within 69


def test_the_hpa_baseline_is_the_controllers_model() -> None:
    assert autoscale_sim.hpa_step is fastgshare.autoscaling.hpa_step
    assert autoscale_sim.HpaState is fastgshare.autoscaling.HpaState


def test_the_fleet_trace_is_seeded_and_heterogeneous() -> None:
    made = fleet(4, 600, functions=10)
    again = fleet(4, 600, functions=10)
    assert [(f.name, f.size, f.memory_scale) for f in made] == [(f.name, f.size, f.memory_scale) for f in again]
    assert [f.trace(t) for f in made for t in range(0, 600, 7)] == [f.trace(t) for f in again for t in range(0, 600, 7)]
    assert all(0.5 <= f.size <= 2 and 0.25 <= f.memory_scale <= 2 for f in made)
    assert len({round(f.size, 6) for f in made}) == 10
    assert all(f.trace(t) >= 0 for f in made for t in range(600))


def test_a_reduced_fleet_packs_every_policy_and_keeps_the_invariants() -> None:
    made = fleet(2, 240, functions=10)
    first = simulate_fleet(PROFILE_DOC, made, 240, trace_name="fleet", seed=2)
    assert simulate_fleet(PROFILE_DOC, fleet(2, 240, functions=10), 240, trace_name="fleet", seed=2) == first
    assert first["functions"] == 10
    results = [first[policy] for policy in POLICIES]
    assert len({r["requests"] for r in results}) == 1  # type: ignore[index]
    for r in results:
        assert r["requests"] > 0  # type: ignore[index]
        assert r["gpu_seconds"] > 0  # type: ignore[index]
        assert r["peak_gpus"] >= 1  # type: ignore[index]
        assert 0 < r["mean_gpus"] <= r["peak_gpus"]  # type: ignore[index]
        assert r["pods_created"] >= 10  # type: ignore[index]  # every function keeps at least one pod
    for policy in ("rpr", "time_sharing_only"):  # the planned SLO capacity covers the rate at every tick
        assert first[policy]["ticks_capacity_below_rate"] == 0  # type: ignore[index]
    assert first["hpa_whole_gpu"]["peak_gpus"] >= 10  # type: ignore[index]  # a whole GPU per pod


def _azure_csv(path: Path, rows: list[list[int]]) -> Path:
    header = ["HashOwner", "HashApp", "HashFunction", "Trigger", *map(str, range(1, 1441))]
    lines = [",".join(header)]
    for i, counts in enumerate(rows):
        minutes = [*counts, *([0] * (1440 - len(counts)))]
        lines.append(",".join([f"owner{i}", f"app{i}", f"{i:040x}", "http", *map(str, minutes)]))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_an_azure_functions_trace_file_runs_as_a_fleet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _azure_csv(tmp_path / "invocations_per_function_md.anon.d01.csv",
                      [[600, 1200], [60, 0, 300], [3000, 3000], [1]])
    made, length = load_azure_trace(path, functions=3, seed=1)
    assert length == 86_400
    assert [f.trace(t) for f in made for t in (30, 61, 150)] == [10, 20, 0, 1, 0, 5, 50, 50, 0]  # count / 60
    result = simulate_fleet(PROFILE_DOC, made, 120, trace_name="file", seed=1)
    expected = 600 + 1200 + 60 + 3000 + 3000  # the first two minutes' counts
    assert 0.9 * expected < result["rpr"]["requests"] < 1.1 * expected  # type: ignore[index]
    main(["--traces", "", "--trace", str(path), "--trace-functions", "2", "--seconds", "60"])
    printed = json.loads(capsys.readouterr().out)
    assert [(run["trace"], run["functions"]) for run in printed["runs"]] == [(f"file:{path.name}", 2)]


def test_a_file_in_another_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.csv"
    path.write_text("function,minute,count\nf,1,3\n")
    with pytest.raises(ValueError, match="missing columns"):
        load_azure_trace(path, functions=5, seed=1)
