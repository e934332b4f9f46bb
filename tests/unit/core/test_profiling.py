"""The profiler's pure parts: arrivals, step analysis, the sweep's rates and verdicts, a point's
maxRps/sloRps from its steps, and pruning of dominated points."""

from __future__ import annotations

import random

import pytest

from fastgshare.profile import LoadStep, Profile, ProfilePoint, Slo, slo_capacity
from fastgshare.profiling import (
    Arrivals,
    RequestTiming,
    SweepPlan,
    Verdict,
    analyse_step,
    arrival_times,
    dominated,
    percentile,
    point_from_steps,
    profile_rows,
    prune,
    step_verdict,
)

SLO = Slo(percentile=95, latency_ms=100)
GIB = 1 << 30


def step(offered: float, achieved: float, p95: float, errors: float = 0.0) -> LoadStep:
    return LoadStep(offered_rps=offered, achieved_rps=achieved, p50_ms=p95 / 2, p95_ms=p95, p99_ms=p95 * 1.2,
                    error_rate=errors)


def point(quota: float, sm: int, max_rps: float, *, memory: int = GIB) -> ProfilePoint:
    return ProfilePoint(quota_request=quota, quota_limit=quota, sm_partition=sm, memory_bytes=memory, max_rps=max_rps,
                        p95_ms=10.0)


def test_constant_arrivals_are_evenly_spaced() -> None:
    assert arrival_times(4, 1.0, Arrivals.CONSTANT, random.Random(0)) == [0, 0.25, 0.5, 0.75]
    assert arrival_times(0, 1.0, Arrivals.CONSTANT, random.Random(0)) == []


def test_poisson_arrivals_have_the_rate_on_average_and_are_reproducible() -> None:
    times = arrival_times(50, 100.0, Arrivals.POISSON, random.Random(1))
    assert times == sorted(times)
    assert all(0 <= t < 100 for t in times)
    assert len(times) == pytest.approx(5000, rel=0.05)
    assert times == arrival_times(50, 100.0, Arrivals.POISSON, random.Random(1))


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50
    assert percentile(values, 95) == 95
    assert percentile(values, 99) == 99
    assert percentile([7.0], 99) == 7
    assert percentile([], 95) == 0


def test_a_step_counts_answers_inside_the_window_and_charges_failures() -> None:
    timings = [RequestTiming(due_s=n * 0.1, latency_ms=20, ok=True) for n in range(10)]  # 10 in 1 s
    timings.append(RequestTiming(due_s=0.95, latency_ms=200, ok=True))  # answered after the window
    result = analyse_step(timings, 1.0)
    assert result.offered_rps == 11
    assert result.achieved_rps == 10
    assert result.p50_ms == 20
    assert result.p99_ms == 200
    assert result.error_rate == 0
    failed = analyse_step([*timings, RequestTiming(due_s=0.5, latency_ms=1500, ok=False)], 1.0)
    assert failed.error_rate == pytest.approx(1 / 12, abs=1e-4)
    assert failed.achieved_rps == 10
    with pytest.raises(ValueError, match="window"):
        analyse_step(timings, 0)


@pytest.mark.parametrize(("load", "slo", "verdict"), [
    (step(10, 10, 50), SLO, Verdict.OK),
    (step(10, 9.5, 150), SLO, Verdict.OVER_SLO),
    (step(10, 9.5, 150), None, Verdict.OK),
    (step(10, 8.5, 50), SLO, Verdict.SATURATING),  # < 90 % but not overloaded
    (step(20, 10, 900), SLO, Verdict.SATURATED),
    (step(10, 10, 50, errors=0.01), SLO, Verdict.ERRORS),
])
def test_step_verdicts(load: LoadStep, slo: Slo | None, verdict: Verdict) -> None:
    assert step_verdict(load, slo) is verdict


def test_a_light_short_step_may_miss_a_request_or_two() -> None:
    light = step(4, 3, 90)  # 4 requests in 1 s, one still in flight at the end
    assert step_verdict(light, SLO) is Verdict.SATURATED
    assert step_verdict(light, SLO, window_s=1.0) is Verdict.OK
    assert step_verdict(step(40, 33, 50), SLO, window_s=1.0) is Verdict.SATURATING  # 7 short: not forgiven


def test_the_sweep_raises_the_rate_then_probes_and_stops() -> None:
    plan = SweepPlan(start_rps=10, factor=1.5)
    assert plan.next_rate([]) == 10
    assert plan.next_rate([(10, Verdict.OK)]) == 15
    assert plan.next_rate([(10, Verdict.OK), (15, Verdict.OVER_SLO)]) == 30  # saturation probe
    assert plan.next_rate([(10, Verdict.OVER_SLO), (20, Verdict.OK)]) == 40  # doubling until saturated
    assert plan.next_rate([(10, Verdict.OK), (15, Verdict.SATURATING)]) == 30
    assert plan.next_rate([(10, Verdict.SATURATING), (20, Verdict.SATURATING)]) is None
    assert plan.next_rate([(10, Verdict.OK), (15, Verdict.SATURATED)]) is None
    assert plan.next_rate([(10, Verdict.ERRORS)]) is None
    assert SweepPlan(start_rps=10, max_steps=2).next_rate([(10, Verdict.OK), (14, Verdict.OK)]) is None
    assert SweepPlan(start_rps=10, max_rps=12).next_rate([(10, Verdict.OK)]) is None
    with pytest.raises(ValueError, match="factor"):
        SweepPlan(start_rps=10, factor=1)
    with pytest.raises(ValueError, match="starting rate"):
        SweepPlan(start_rps=0)


def test_a_point_takes_max_rps_from_any_step_and_slo_rps_from_the_crossing() -> None:
    steps = [step(10, 10, 30), step(20, 20, 60), step(30, 29, 120), step(60, 40, 2000)]
    result = point_from_steps(quota_request=0.5, quota_limit=0.5, sm_partition=50, memory_bytes=GIB, steps=steps,
                              slo=SLO)
    assert result.max_rps == 40
    # the bound is 90 ms (10 % margin): between 20 req/s at 60 ms and 29 req/s at 120 ms
    assert result.slo_rps == pytest.approx(20 + (90 - 60) / (120 - 60) * 9, abs=1e-3)
    assert result.slo_rps == pytest.approx(slo_capacity(result, SLO), abs=1e-3)
    assert result.p95_ms == 120  # the highest sustained step, not the overloaded one
    assert result.steps == tuple(steps)
    no_slo = point_from_steps(quota_request=0.5, quota_limit=0.5, sm_partition=50, memory_bytes=GIB, steps=steps,
                              slo=None)
    assert no_slo.slo_rps == 0
    assert no_slo.max_rps == 40


def test_a_point_that_never_meets_the_slo_has_no_slo_capacity() -> None:
    result = point_from_steps(quota_request=0.2, quota_limit=0.2, sm_partition=100, memory_bytes=GIB,
                              steps=[step(5, 5, 150), step(10, 6, 900)], slo=SLO)
    assert result.slo_rps == 0
    assert result.max_rps == 6
    with pytest.raises(ValueError, match="at least one"):
        point_from_steps(quota_request=0.2, quota_limit=0.2, sm_partition=100, memory_bytes=GIB, steps=[], slo=SLO)


def test_dominated_points_need_no_more_capacity_with_more_resources() -> None:
    points = [
        point(0.5, 50, 40),  # dominates the next two
        point(0.5, 100, 40),  # same rate, more SM
        point(1.0, 50, 39),  # less rate, more quota
        point(0.25, 100, 20),  # less rate but less quota: kept
        point(0.5, 50, 40, memory=2 * GIB),  # more memory
        point(1.0, 100, 80),  # the most capacity: kept
    ]
    assert dominated(points, None) == [False, True, True, False, True, False]


def test_identical_points_do_not_dominate_each_other_and_batches_are_not_compared() -> None:
    same = [point(0.5, 50, 40), point(0.5, 50, 40)]
    assert dominated(same, None) == [False, False]
    other_batch = ProfilePoint(quota_request=1.0, quota_limit=1.0, sm_partition=100, memory_bytes=GIB, batch=4,
                               max_rps=10)
    assert dominated([point(0.5, 50, 40), other_batch], None) == [False, False]


def test_with_an_slo_pruning_compares_slo_capacity() -> None:
    fast = ProfilePoint(quota_request=1.0, quota_limit=1.0, sm_partition=100, memory_bytes=GIB, max_rps=80,
                        p95_ms=200)  # imported: at saturation over the SLO
    feasible = ProfilePoint(quota_request=1.0, quota_limit=1.0, sm_partition=100, memory_bytes=GIB, max_rps=50,
                            steps=(step(10, 10, 30), step(50, 50, 60)))
    slow = ProfilePoint(quota_request=1.0, quota_limit=1.0, sm_partition=100, memory_bytes=GIB, max_rps=80,
                        steps=(step(10, 10, 300), step(80, 80, 600)))
    assert dominated([feasible, slow], SLO) == [False, True]
    assert dominated([feasible, slow], None) == [True, False]
    profile = Profile(function="f", points=(feasible, slow, fast), slo=SLO)
    kept, gone = prune(profile)
    assert kept.points == (feasible,)
    assert set(gone) == {slow, fast}
    rows = profile_rows(profile)
    assert [row["dominated"] for row in rows] == [False, True, True]
    assert rows[0]["sloRps"] == 50
    assert rows[0]["config"] == "q100-s100"
    assert rows[0]["steps"] == 2
