"""The autoscaling simulation's CI subset: one ramp period, a reduced fleet, a tiny trace file in the
Azure Functions schema, a profile with a quota ladder (so the scaler's vertical steps and re-plans
happen) and short robustness variations; deterministic, and only structure and invariants are asserted
here (the issue's targets are the full bench's, reported there)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import attrs
import pytest

import fastgshare.autoscaling
from bench import autoscale_sim
from bench.autoscale_sim import (
    PARKED,
    POLICIES,
    PROFILE,
    Simulation,
    fleet,
    load_azure_trace,
    main,
    make_function,
    model_capacity,
    ramp,
    robustness,
    run,
    simulate,
    simulate_fleet,
    sparse,
)
from fastgshare.autoscaling import running
from fastgshare.gpu_models import gpu_model_spec
from fastgshare.inventory import GpuSpec
from fastgshare.profile import Profile, Slo, decode_profile

PROFILE_DOC = decode_profile(PROFILE.read_text())
SMALL = ("rpr", "rpr_area", "time_sharing_only", "hpa_whole_gpu")


def _ladder() -> Profile:
    """The whole-GPU point and three quotas on half the SMs: a running pod's quota can rise (the example
    profile has no two usable points of the same SM and memory)."""
    whole = next(p for p in PROFILE_DOC.points if p.key == "q100-s100")
    half = [attrs.evolve(whole, quota_request=q, quota_limit=q, sm_partition=50, max_rps=rps, slo_rps=0.0, steps=())
            for q, rps in ((0.4, 30.0), (0.6, 45.0), (0.8, 60.0))]
    return attrs.evolve(PROFILE_DOC, points=(whole, *half))


LADDER = _ladder()


def test_one_ramp_period_is_deterministic_and_rpr_beats_time_sharing(capsys: pytest.CaptureFixture[str]) -> None:
    first = simulate(PROFILE_DOC, "ramp", 180, seed=3, policies=SMALL)
    argv = ["--traces", "ramp", "--seconds", "180", "--seed", "3", "--policies", ",".join(SMALL)]
    main(argv)
    printed = capsys.readouterr().out
    main(argv)
    assert capsys.readouterr().out == printed  # same seed, identical JSON
    assert json.loads(printed)["runs"] == [json.loads(json.dumps(first))]
    rpr, time_sharing, hpa = first["rpr"], first["time_sharing_only"], first["hpa_whole_gpu"]
    assert rpr["requests"] == time_sharing["requests"] == hpa["requests"] > 10_000  # type: ignore[index]
    assert rpr["slo_violations_pct_after_first_cold_start"] <= 2.0  # type: ignore[index]  # the bench reports the rest
    assert rpr["gpu_seconds"] < time_sharing["gpu_seconds"]  # type: ignore[index]
    assert first["slo_capacity_rps"]["q20-s6"] == 0  # type: ignore[index]  # 74 ms a request: never within 69
    for policy in SMALL:
        result = first[policy]
        assert result["vertical_steps"] == result["pods_resized_in_place"] == 0  # type: ignore[index]  # no ladder
        assert first[policy]["ticks_capacity_below_rate"] == 0 or policy.startswith("hpa")  # type: ignore[index]


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
    first = simulate_fleet(PROFILE_DOC, made, 240, trace_name="fleet", seed=2, policies=POLICIES)
    alone = simulate_fleet(PROFILE_DOC, fleet(2, 240, functions=10), 240, trace_name="fleet", seed=2,
                           policies=("rpr",))["rpr"]
    with_zero = dict(first["rpr"])  # type: ignore[call-overload]
    assert with_zero.pop("from_zero")["cold_episodes"] == 0  # reported beside rpr_zero and rpr_parked
    assert alone == {**with_zero, "gpu_seconds_ratio_vs_hpa": None}  # no HPA ran
    assert first["functions"] == 10
    results = [first[policy] for policy in POLICIES]
    assert len({r["requests"] for r in results}) == 1  # type: ignore[index]
    for r in results:
        assert r["requests"] > 0  # type: ignore[index]
        assert r["gpu_seconds"] > 0  # type: ignore[index]
        assert r["peak_gpus"] >= 1  # type: ignore[index]
        assert 0 < r["mean_gpus"] <= r["peak_gpus"]  # type: ignore[index]
        assert r["pods_created"] >= 10  # type: ignore[index]  # every function keeps at least one pod
    for policy in ("rpr", "rpr_area", "time_sharing_only"):  # the planned SLO capacity covers the rate at every tick
        assert first[policy]["ticks_capacity_below_rate"] == 0  # type: ignore[index]
    assert first["hpa_whole_gpu"]["peak_gpus"] >= 10  # type: ignore[index]  # a whole GPU per pod


def test_a_vertical_step_changes_the_running_pods_in_place() -> None:
    gpu = gpu_model_spec("V100-32GB")
    capacities = {p.key: model_capacity(p, LADDER.slo or Slo(percentile=95, latency_ms=69), 1) for p in LADDER.points}
    sim = Simulation(make_function("f", lambda t: 0.0, LADDER, gpu, capacities), "rpr", cold_start_s=5, seed=1)
    sim.scale_to({"q40-s50": 2}, 0.0)
    pods = sorted(sim.live.values(), key=lambda p: p.name)
    pods[0].finishes.append(6.0)
    sim.scale_to({"q60-s50": 2}, 3.0)  # same SM, memory and batch: a live share change
    assert sorted(sim.live.values(), key=lambda p: p.name) == pods  # the same pods, ready at 5 s, queue kept
    assert [(p.option.point.key, p.created, p.ready, p.finishes) for p in pods] == [
        ("q60-s50", 0.0, 5.0, [6.0]), ("q60-s50", 0.0, 5.0, [])]
    assert (sim.result.pods_created, sim.result.vertical_steps, sim.result.pods_resized) == (2, 1, 2)
    sim.scale_to({"q80-s50": 1, "q100-s100": 1}, 4.0)  # one pod raised again, the other replaced: other SM
    assert sorted(sim.live_counts().items()) == [("q100-s100", 1), ("q80-s50", 1)]
    assert [p.name for p in sim.live.values() if p.option.point.key == "q80-s50"] == [pods[0].name]
    assert (sim.result.pods_created, sim.result.vertical_steps, sim.result.pods_resized) == (3, 2, 3)


def test_the_simulation_runs_the_scalers_plan_make_before_break(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {"kept": 0, "settled": 0, "vertical": 0}
    tick = Simulation.tick

    def checked(self: Simulation, policy: str, now: float) -> None:
        before, ready = self.scaler, self.ready_counts(now)
        live, created, vertical = dict(self.live), self.result.pods_created, self.result.vertical_steps
        tick(self, policy, now)
        assert dict(self.live_counts()) == running(self.scaler)  # target and kept pods run, nothing else
        by_key = {o.point.key: o for o in self.options}
        assert self.scaler.capacity(by_key) + 1e-9 >= self.rate(now, 10)  # the planned capacity covers the rate
        if self.scaler.last_rebalance_s == now:  # a re-plan only while no pod is starting
            assert all(pod.ready <= now for pod in live.values())
        if before.keep:
            seen["kept"] += 1
            if all(ready[key] >= n for key, n in before.pods.items()):  # the new pods were ready: the old go
                seen["settled"] += 1
                assert not self.scaler.keep or self.scaler.last_rebalance_s == now
        if self.result.vertical_steps > vertical:  # pods resized in place: none created, the same pods
            seen["vertical"] += 1
            assert self.result.pods_created == created
            assert set(self.live) == set(live)
            assert all(self.live[name] is pod for name, pod in live.items())

    monkeypatch.setattr(Simulation, "tick", checked)
    result = simulate(LADDER, "bursty", 900, seed=3, gpu_model="V100-32GB", policies=("rpr",))["rpr"]
    assert min(seen.values()) >= 1, seen
    assert min(result["rebalances"], result["vertical_steps"]) >= 1  # type: ignore[index]
    assert result["ticks_capacity_below_rate"] == 0  # type: ignore[index]


def test_robustness_varies_kappa_cold_start_and_profile_error() -> None:
    rows = robustness(PROFILE_DOC, "ramp", 120, seed=2)
    assert [(r["kappa"], r["cold_start_s"], r["profile_error"]) for r in rows] == [
        ("3.15", 5.0, 1.0), ("1.5", 5.0, 1.0), ("inf", 5.0, 1.0), ("3.15", 1.0, 1.0), ("3.15", 10.0, 1.0),
        ("3.15", 5.0, 0.8), ("3.15", 5.0, 1.2)]
    base, low, unbounded = rows[:3]
    assert low["gpu_seconds"] >= base["gpu_seconds"] >= unbounded["gpu_seconds"] > 0  # type: ignore[operator]
    assert low["requests"] == base["requests"] == unbounded["requests"]
    gpu = gpu_model_spec("V100-16GB")
    capacities = {p.key: model_capacity(p, PROFILE_DOC.slo or Slo(percentile=95, latency_ms=69), 1)
                  for p in PROFILE_DOC.points}
    exact = make_function("f", lambda t: 1.0, PROFILE_DOC, gpu, capacities)
    optimistic = make_function("f", lambda t: 1.0, PROFILE_DOC, gpu, capacities, profile_error=1.2)
    assert optimistic.capacity == exact.capacity  # what pods serve
    assert [math.isclose(o.capacity_rps, 1.2 * e.capacity_rps) for o, e in  # what the planner believes
            zip(optimistic.options["rpr"], exact.options["rpr"], strict=True)] == [True] * len(exact.options["rpr"])


def test_a_32_gb_gpu_packs_the_2_gb_pods_by_slots(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--traces", "ramp", "--seconds", "120", "--gpu", "V100-32GB", "--policies", "rpr"])
    printed = json.loads(capsys.readouterr().out)
    (only,) = printed["runs"]
    assert (only["gpu"], printed["policies"]) == ("V100-32GB", ["rpr"])
    assert only["gpu_seconds_rpr_to_hpa"] is None  # no baseline ran
    with pytest.raises(SystemExit):
        main(["--policies", "rpr,nope"])


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
    result = simulate_fleet(PROFILE_DOC, made, 120, trace_name="file", seed=1, policies=("rpr",))
    expected = 600 + 1200 + 60 + 3000 + 3000  # the first two minutes' counts
    assert 0.9 * expected < result["rpr"]["requests"] < 1.1 * expected  # type: ignore[index]
    main(["--traces", "", "--trace", str(path), "--trace-functions", "2", "--seconds", "60", "--policies", "rpr"])
    printed = json.loads(capsys.readouterr().out)
    assert [(run["trace"], run["functions"]) for run in printed["runs"]] == [(f"file:{path.name}", 2)]


def test_a_file_in_another_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.csv"
    path.write_text("function,minute,count\nf,1,3\n")
    with pytest.raises(ValueError, match="missing columns"):
        load_azure_trace(path, functions=5, seed=1)


def _functions(trace: str, gpu: GpuSpec) -> list[autoscale_sim.Function]:
    capacities = {p.key: model_capacity(p, PROFILE_DOC.slo or Slo(percentile=95, latency_ms=69), 2)
                  for p in PROFILE_DOC.points}
    if trace == "ramp":
        return [make_function("f", ramp, PROFILE_DOC, gpu, capacities)]
    return [make_function(f.name, f.trace, PROFILE_DOC, gpu, capacities, size=f.size, memory_scale=f.memory_scale)
            for f in fleet(2, 240, functions=10)]


@pytest.mark.parametrize(("trace", "seconds"), [("ramp", 180), ("fleet", 240)])
def test_model_sharing_never_uses_more_gpus_than_rpr_and_fewer_where_memory_binds(trace: str, seconds: int) -> None:
    gpu = gpu_model_spec("V100-16GB")
    functions = _functions(trace, gpu)
    plain: list[tuple[int, dict[str, int]]] = []
    shared: list[tuple[int, dict[str, int]]] = []
    alone = run(functions, seconds, "rpr", gpu=gpu, seed=2, cold_start_s=5, record=plain)
    sharing = run(functions, seconds, "rpr_model_sharing", gpu=gpu, seed=2, cold_start_s=5, record=shared)
    assert len(plain) == len(shared) == seconds
    assert all(s <= p for (p, _), (s, _) in zip(plain, shared, strict=True))  # at every tick
    memory_binds = [i for i, (gpus, bounds) in enumerate(plain)
                    if gpus == bounds["memory"] > max(bounds["area"], bounds["slots"], bounds["kappa"])]
    assert memory_binds  # 2 GB pods on a 16 GB GPU
    assert all(shared[i][0] < plain[i][0] for i in memory_binds)
    for gpus, bounds in plain + shared:  # the lower bounds are bounds
        assert gpus >= max(bounds.values())
    # the same pods, requests and latencies: model sharing changes only the packing
    assert {k: v for k, v in alone.items() if "gpu" not in k and "bound" not in k} == {
        k: v for k, v in sharing.items() if "gpu" not in k and "bound" not in k and k != "model_sharing"}
    assert sharing["gpu_seconds"] < alone["gpu_seconds"]  # type: ignore[operator]
    assert sharing["model_sharing"] == {"weights_fraction": autoscale_sim.WEIGHTS_FRACTION,
                                        "source": autoscale_sim.WEIGHTS_SOURCE}
    assert alone["bound_by"] == "memory" != sharing["bound_by"]


def test_the_weights_fraction_sets_how_much_model_sharing_saves(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--traces", "ramp", "--seconds", "120", "--policies", "rpr,rpr_model_sharing,hpa_whole_gpu"]
    ratios = []
    for fraction in ("0", "0.3", "0.8"):
        main([*argv, "--weights-fraction", fraction])
        printed = json.loads(capsys.readouterr().out)
        assert printed["model_sharing"]["weights_fraction"] == float(fraction)
        (only,) = printed["runs"]
        ratios.append(only["rpr_model_sharing"]["gpu_seconds_ratio_vs_hpa"])
        if fraction == "0":  # nothing shared: the same GPUs as rpr
            assert ratios[0] == only["rpr"]["gpu_seconds_ratio_vs_hpa"]
        target = only["targets"]["rpr_model_sharing"]
        assert target["gpu_seconds_ratio_vs_hpa"]["at_most"] == 0.6
        assert target["gpu_seconds_ratio_vs_hpa"]["met"] == (ratios[-1] <= 0.6)
        assert target["slo_violations_pct"]["met"] == (only["rpr_model_sharing"]["slo_violations_pct"] <= 1)
        assert "hpa_whole_gpu" not in only["targets"]
    assert ratios[0] > ratios[1] >= ratios[2]
    with pytest.raises(SystemExit):
        main([*argv, "--weights-fraction", "1"])
    assert "--weights-fraction 1.0: must be in [0, 1)" in capsys.readouterr().err


FROM_ZERO = ("rpr_zero", "rpr", "rpr_parked")


def test_the_sparse_trace_is_seeded_and_idles_longer_than_the_scale_down_delay() -> None:
    rate, again = sparse(5), sparse(5)
    samples = [rate(t / 2) for t in range(14_400)]
    assert samples == [again(t / 2) for t in range(14_400)]
    assert all(r == 0 or 2 <= r <= 40 for r in samples)
    starts = [i for i in range(1, len(samples)) if samples[i] and not samples[i - 1]]
    ends = [i for i in range(1, len(samples)) if samples[i - 1] and not samples[i]]
    assert len(starts) >= 10
    gaps = [(start - end) / 2 for end, start in zip(ends, starts[1:], strict=False)]
    assert min(gaps) > autoscale_sim.RPR_SETTINGS.scale_down_delay_s  # every gap lets rpr_zero go to zero
    assert sum(samples) / 2 < 0.25 * max(samples) * 3600  # idle most of the time


def test_a_parked_pod_holds_its_memory_and_wakes_in_wake_s_for_the_first_request() -> None:
    gpu = gpu_model_spec("V100-16GB")
    capacities = {p.key: model_capacity(p, PROFILE_DOC.slo or Slo(percentile=95, latency_ms=69), 1)
                  for p in PROFILE_DOC.points}
    function = make_function("f", lambda t: 0.0, PROFILE_DOC, gpu, capacities)
    sim = Simulation(function, "rpr_parked", cold_start_s=5, seed=1, wake_s=0.25)
    for now in range(12):
        sim.tick("rpr_parked", float(now))
    assert not sim.live  # nothing awake, one pod parked (created: no pod was running), its model loaded by 5 s
    ((name, pod),) = sim.parked.items()
    assert (pod.option.point.key, pod.ready, sim.result.pods_created) == ("q40-s12", 5.0, 1)
    assert sim.pod_counts() == {"q40-s12" + PARKED: 1}
    assert sim.result.parked_seconds == 12
    sim.arrive(20.0)  # no awake pod: a cold episode; the parked pod wakes at once
    assert (sim.live[name], sim.parked, sim.ready_at[-1]) == (pod, {}, 20.25)
    assert (sim.scaler.pods, sim.scaler.last_up_s) == ({"q40-s12": 1}, 20.0)  # the scaler's one pod, as scaled up
    sim.arrive(20.1)  # still waking: the same episode
    sim.drain(20.25)
    assert [(at, round(wait, 9), woken, timed_out) for at, wait, woken, timed_out in sim.result.cold_episodes] == [
        (20.0, 0.25, True, False)]
    assert (len(sim.result.latencies), sim.result.pods_created) == (2, 1)  # both served by the woken pod
    fleet_gpus = autoscale_sim.Fleet([function], gpu)
    parked = fleet_gpus.lower_bounds(((0, "q40-s12" + PARKED, 9),))  # no time x SM area, no speed; memory, slots
    assert (parked["area"], parked["kappa"], parked["memory"], parked["slots"]) == (0, 0, 2, 1)
    assert fleet_gpus.gpus(((0, "q40-s12" + PARKED, 9),)) == 2  # 9 x 2 GB on 16 GB GPUs
    assert fleet_gpus.lower_bounds(((0, "q40-s12", 9),))["area"] > 0


def test_parked_pods_cut_the_first_request_wait_from_a_cold_start_to_wake_s(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--traces", "sparse", "--seconds", "1800", "--seed", "2", "--policies", ",".join(FROM_ZERO),
            "--wake-s", "0.2"]
    main(argv)
    printed = json.loads(capsys.readouterr().out)
    assert printed["from_zero"]["wake_s"] == 0.2
    assert printed["from_zero"]["parked_pods"] == {"rpr_zero": 0, "rpr_parked": 1}
    (only,) = printed["runs"]
    zero, always, parked = (only[p] for p in FROM_ZERO)
    assert zero["requests"] == always["requests"] == parked["requests"] > 0
    assert always["from_zero"]["cold_episodes"] == 0  # minReplicas 1: one pod always awake
    assert zero["from_zero"]["cold_episodes"] >= 3
    assert zero["from_zero"]["woken_parked"] == 0
    assert zero["from_zero"]["first_request_wait_s"]["median"] >= 5  # the cold start, after the scaler's tick
    assert parked["from_zero"]["woken_parked"] == parked["from_zero"]["cold_episodes"] >= 3
    assert parked["from_zero"]["first_request_wait_s"] == {"median": 0.2, "p95": 0.2, "max": 0.2}
    assert parked["from_zero"]["parked_memory_gib_seconds"] == 2 * parked["from_zero"]["parked_pod_seconds"] > 0
    assert zero["from_zero"]["parked_pod_seconds"] == always["from_zero"]["parked_pod_seconds"] == 0
    # one function on one GPU: the parked pod keeps its GPU counted, not its time
    assert parked["gpu_seconds"] == always["gpu_seconds"] == 1800
    assert parked["from_zero"]["gpu_seconds_without_parked"] < parked["gpu_seconds"]
    assert zero["gpu_seconds"] < always["gpu_seconds"]
    assert parked["area_seconds"] < always["area_seconds"]
    for argument in ("-1", "nan"):
        with pytest.raises(SystemExit):
            main([*argv, "--wake-s", argument])
        assert "--wake-s" in capsys.readouterr().err


def test_the_from_zero_policies_leave_the_other_policies_results_as_they_were() -> None:
    alone = simulate(PROFILE_DOC, "ramp", 120, seed=2, policies=("rpr", "hpa_whole_gpu"))
    assert "from_zero" not in alone["rpr"]  # type: ignore[operator]
    beside = simulate(PROFILE_DOC, "ramp", 120, seed=2, policies=("rpr", "hpa_whole_gpu", *FROM_ZERO[::2]))
    for policy in ("rpr", "hpa_whole_gpu"):
        reported = dict(beside[policy])  # type: ignore[call-overload]
        assert reported.pop("from_zero")["cold_episodes"] == 0
        assert reported == alone[policy]
    # a ramp never idles: scaled from zero only at the start, the three serve the same requests alike
    assert beside["rpr_zero"]["from_zero"]["cold_episodes"] == 0  # type: ignore[index]
    assert beside["rpr_parked"]["from_zero"]["parked_pod_seconds"] <= 5  # type: ignore[index]
