"""The planner: capacity covers the demand, no plan of one configuration is cheaper, the cost is
within one pod of the best configuration of the cheapest plan (by brute force on small cases) and
within the fill-then-cover bound of the exact optimum (an integer program), monotone in demand,
and only configurations that meet the SLO and fit the GPU are used."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import Bounds, LinearConstraint, milp

from fastgshare.autoscaling import (
    CostModel,
    GpuBudget,
    HpaSettings,
    HpaState,
    Option,
    Plan,
    PlanError,
    ScalerState,
    ScalingSettings,
    cost_of,
    hpa_step,
    options,
    plan,
    running,
    settle,
    step,
    vertical_step,
)
from fastgshare.profile import LoadStep, ProfilePoint, Slo

GiB = 2**30
GPU = GpuBudget(memory_bytes=16 * GiB, slots=16)
SLO = Slo(percentile=95, latency_ms=100)


def point(quota: float, sm: int, rps: float, *, p95: float = 50, memory: int = GiB) -> ProfilePoint:
    return ProfilePoint(quota_request=quota, quota_limit=quota, sm_partition=sm, memory_bytes=memory, max_rps=rps,
                        p95_ms=p95)


option_strategy = st.builds(
    lambda quota, sm, rps, memory: Option(point=point(quota / 10, sm, rps, memory=memory * GiB), capacity_rps=rps,
                                          cost=cost_of(point(quota / 10, sm, rps, memory=memory * GiB), GPU)),
    st.integers(1, 10), st.sampled_from([6, 12, 24, 50, 100]), st.floats(0.5, 80), st.integers(1, 8))


def usable_options(max_size: int) -> st.SearchStrategy[list[Option]]:
    return st.lists(option_strategy, min_size=1, max_size=max_size, unique_by=lambda o: o.point.key)


def covers(result: Plan, demand: float) -> bool:
    return result.capacity_rps >= demand - 1e-6


@settings(max_examples=300, deadline=None)
@given(usable_options(6),
       st.floats(0, 500))
def test_the_plan_covers_the_demand_and_no_single_configuration_is_cheaper(usable: list[Option],
                                                                           demand: float) -> None:
    result = plan(demand, usable)
    assert covers(result, demand)
    for option in usable:
        alone = max(1, math.ceil(demand / option.capacity_rps - 1e-9)) * option.cost if demand > 1e-9 else 0
        assert result.cost <= alone + 1e-9


@settings(max_examples=150, deadline=None)
@given(usable_options(3),
       st.floats(0.1, 60))
def test_the_cost_is_within_one_pod_of_the_best_configuration_of_the_cheapest_plan(usable: list[Option],
                                                                                   demand: float) -> None:
    result = plan(demand, usable)
    bound = [math.ceil(demand / o.capacity_rps) for o in usable]
    cheapest = min(sum(n * o.cost for n, o in zip(counts, usable, strict=True))
                   for counts in itertools.product(*(range(b + 1) for b in bound))
                   if sum(n * o.capacity_rps for n, o in zip(counts, usable, strict=True)) >= demand - 1e-9)
    best = max(usable, key=lambda o: o.efficiency)
    assert result.cost < cheapest + best.cost + 1e-9


def exact_optimum(demand: float, usable: list[Option]) -> float:
    """The cheapest whole-pod plan that covers ``demand``: an integer program solved by HiGHS (scipy)."""
    costs = np.array([o.cost for o in usable])
    capacities = np.array([[o.capacity_rps for o in usable]])
    solved = milp(costs, constraints=LinearConstraint(capacities, lb=demand - 1e-9), integrality=np.ones(len(usable)),
                  bounds=Bounds(0, np.inf))
    assert solved.success, solved.message
    return float(solved.fun)


@settings(max_examples=400, deadline=None)
@given(usable_options(6),
       st.floats(1, 500))
def test_the_plan_costs_at_most_the_fractional_optimum_plus_the_cheapest_cover_of_the_rest(usable: list[Option],
                                                                                            demand: float) -> None:
    """The planner's guarantee, against the exact optimum. The most efficient configuration b fills
    k = floor(D / cap_b) pods; what it leaves, r, is covered by the cheapest whole pods of one
    configuration. So cost <= k x c_b + cover(r) = LP + (cover(r) - r / eff_b), where LP = D / eff_b is
    the fractional optimum, below the exact one. Filling with another configuration breaks this
    bound on about one random profile in ten (measured: 149 of 1,500), the one-configuration
    bound of the test above does not see it."""
    result = plan(demand, usable)
    best = max(usable, key=lambda o: o.efficiency)
    filled = math.floor(demand / best.capacity_rps + 1e-9)
    rest = demand - filled * best.capacity_rps
    cover = min(max(1, math.ceil(rest / o.capacity_rps - 1e-9)) * o.cost for o in usable) if rest > 1e-9 else 0.0
    fractional = demand / best.efficiency
    optimum = exact_optimum(demand, usable)
    assert fractional - 1e-9 <= optimum <= result.cost + 1e-9
    assert result.cost <= fractional + (cover - rest / best.efficiency) + 1e-9, (result, optimum)


@settings(max_examples=200, deadline=None)
@given(usable_options(5),
       st.floats(0, 300), st.floats(0, 50))
def test_more_demand_never_costs_less(usable: list[Option], demand: float, more: float) -> None:
    assert plan(demand + more, usable).cost >= plan(demand, usable).cost - 1e-9


def test_only_configurations_that_meet_the_slo_and_fit_the_gpu_are_used() -> None:
    fast = point(0.4, 12, 30, p95=60)
    too_slow = point(0.2, 6, 100, p95=95)  # 95 ms > (1 - 0.1) x 100 ms
    too_big = point(0.5, 50, 500, memory=32 * GiB)
    usable = options([fast, too_slow, too_big], SLO, GPU)
    assert [o.point for o in usable] == [fast]
    result = plan(70, usable)
    assert [(c.option.point, c.replicas) for c in result.configs] == [(fast, 3)]


def test_the_most_efficient_configuration_fills_and_a_smaller_one_covers_the_rest() -> None:
    # efficiency = capacity / dominant cost: (0.4, 12 %) costs max(0.048, 1/16 GiB, 1/16) = 0.0625
    small = point(0.4, 12, 30)   # 480 req/s per GPU
    large = point(1.0, 100, 100, memory=4 * GiB)  # cost 1: 100 per GPU
    tiny = point(0.2, 6, 10)     # cost 1/16 too, but 160 per GPU
    usable = options([small, large, tiny], SLO, GPU)
    assert usable[0].point == small
    result = plan(95, usable)  # 3 x 30 = 90, then 5 req/s: one tiny pod costs as much as a small one
    assert {c.option.point.key: c.replicas for c in result.configs} == {"q40-s12": 4}
    assert result.capacity_rps == 120


def test_the_area_cost_model_counts_time_times_sm_only() -> None:
    config = point(0.4, 12, 30)
    assert cost_of(config, GPU, CostModel.AREA) == pytest.approx(0.048)
    assert cost_of(config, GPU, CostModel.DOMINANT) == pytest.approx(1 / 16)


def test_measured_steps_decide_the_slo_capacity() -> None:
    steps = (LoadStep(offered_rps=10, achieved_rps=10, p50_ms=20, p95_ms=40, p99_ms=50),
             LoadStep(offered_rps=20, achieved_rps=20, p50_ms=30, p95_ms=80, p99_ms=90),
             LoadStep(offered_rps=30, achieved_rps=25, p50_ms=60, p95_ms=120, p99_ms=200))
    measured = ProfilePoint(quota_request=0.4, quota_limit=0.4, sm_partition=12, memory_bytes=GiB, max_rps=25,
                            steps=steps)
    (option,) = options([measured], SLO, GPU)
    assert option.capacity_rps == pytest.approx(20 + (90 - 80) / (120 - 80) * 5)  # bound 90 ms, interpolated


def test_no_demand_needs_no_pods_and_bad_input_says_why() -> None:
    assert plan(0, []).configs == ()
    with pytest.raises(PlanError, match="no configuration of the profile meets the SLO"):
        plan(5, [])
    with pytest.raises(PlanError, match="demand must be a finite number"):
        plan(float("nan"), options([point(0.4, 12, 30)], SLO, GPU))


# --- the scaling step ----------------------------------------------------------------------
STEP_OPTIONS = options([point(0.4, 12, 30), point(1.0, 100, 100, memory=4 * GiB), point(0.2, 6, 10)],
                       Slo(percentile=95, latency_ms=100), GPU)
BY_KEY = {o.point.key: o for o in STEP_OPTIONS}
SETTINGS = ScalingSettings(headroom=0.5, scale_down_delay_s=60, dead_band=0.25)


def capacity(state: ScalerState) -> float:
    return state.capacity(BY_KEY)


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 400), st.floats(0, 400), st.dictionaries(st.sampled_from(sorted(BY_KEY)), st.integers(0, 10)))
def test_scaling_up_is_immediate_and_keeps_the_running_pods(rate: float, short: float, pods: dict[str, int]) -> None:
    before = ScalerState(pods=pods, last_up_s=99, last_down_s=99)
    after = step(before, STEP_OPTIONS, rate_long=rate, rate_short=short, now_s=100, settings=SETTINGS)
    assert capacity(after) >= rate * 1.5 - 1e-6
    if capacity(after) > capacity(before) + 1e-9:
        assert all(after.pods.get(key, 0) >= n for key, n in pods.items())


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 400), st.dictionaries(st.sampled_from(sorted(BY_KEY)), st.integers(0, 10)),
       st.floats(0, 200))
def test_scaling_down_waits_for_the_delay_and_never_goes_below_the_target(rate: float, pods: dict[str, int],
                                                                          since: float) -> None:
    before = ScalerState(pods=pods, last_up_s=1000 - since, last_down_s=-math.inf)
    after = step(before, STEP_OPTIONS, rate_long=rate, rate_short=0, now_s=1000, settings=SETTINGS)
    if capacity(after) < capacity(before) - 1e-9:
        assert since >= 60
        assert capacity(after) >= rate * 1.5 - 1e-6
        # a scale-down, or a re-plan that keeps the old pods until the new ones are ready
        assert after.last_down_s == 1000 or (after.last_rebalance_s == 1000 and after.keep == {
            k: n for k, n in pods.items() if n > 0})


def test_the_least_efficient_pods_go_first() -> None:
    before = ScalerState(pods={"q100-s100": 1, "q40-s12": 4})  # 220 req/s of capacity
    after = step(before, STEP_OPTIONS, rate_long=60, rate_short=0, now_s=1000, settings=SETTINGS)
    # target 60 x 1.5 = 90: the whole-GPU pod (100 req/s per GPU) goes first, then one small one
    assert after.pods == {"q40-s12": 3}


def test_a_burst_in_the_short_window_is_trusted_only_when_it_doubles_the_capacity() -> None:
    running = ScalerState(pods={"q40-s12": 2})  # 60 req/s
    calm = step(running, STEP_OPTIONS, rate_long=30, rate_short=100, now_s=10, settings=SETTINGS)
    assert capacity(calm) == 60  # 100 < 2 x 60: the long window (30 x 1.5 = 45) rules
    burst = step(running, STEP_OPTIONS, rate_long=30, rate_short=130, now_s=10, settings=SETTINGS)
    assert capacity(burst) >= 130 * 1.5


def test_the_pod_count_stays_within_its_bounds() -> None:
    bounded = ScalingSettings(min_pods=2, max_pods=3)
    assert sum(step(ScalerState(), STEP_OPTIONS, rate_long=0, rate_short=0, now_s=0, settings=bounded)
               .pods.values()) == 2
    assert sum(step(ScalerState(), STEP_OPTIONS, rate_long=1000, rate_short=0, now_s=0, settings=bounded)
               .pods.values()) == 3


# --- the vertical step and the re-plan ----------------------------------------------------
# Same SM and memory, three quotas: 4 GiB of a 16 GiB GPU makes a pod cost at least 0.25, so the
# two smaller quotas cost the same and raising one to the other adds capacity for nothing.
VERTICAL_OPTIONS = options([point(0.2, 50, 10, memory=4 * GiB), point(0.4, 50, 20, memory=4 * GiB),
                            point(0.8, 50, 40, memory=4 * GiB), point(0.1, 6, 4)],
                           Slo(percentile=95, latency_ms=100), GPU)
VERTICAL_BY_KEY = {o.point.key: o for o in VERTICAL_OPTIONS}


def test_a_vertical_step_raises_the_running_pods_quota_when_it_covers_the_need_as_cheaply() -> None:
    before = ScalerState(pods={"q20-s50": 2})  # 20 req/s
    after = step(before, VERTICAL_OPTIONS, rate_long=24, rate_short=0, now_s=5, settings=SETTINGS)
    # target 36: raising both pods to quota 0.4 (40 req/s) adds no cost; new pods would
    assert after.pods == {"q40-s50": 2}
    assert after.last_up_s == 5
    without = step(before, VERTICAL_OPTIONS, rate_long=24, rate_short=0, now_s=5,
                   settings=ScalingSettings(headroom=0.5, vertical=False))
    assert without.pods["q20-s50"] == 2
    assert sum(without.pods.values()) > 2


def test_no_vertical_step_when_adding_pods_costs_less_or_nothing_covers_the_need() -> None:
    usable = VERTICAL_BY_KEY
    # 2 pods from 0.4 to 0.8 add 40 req/s for 0.3 of a GPU; 2 small pods (q10-s6) cover 8 req/s for 0.125
    assert vertical_step({"q40-s50": 2}, VERTICAL_OPTIONS, 8) is None
    raised = vertical_step({"q40-s50": 2}, VERTICAL_OPTIONS, 40)
    assert raised is not None
    assert raised.target is usable["q80-s50"]
    assert raised.added_capacity_rps == 40
    assert vertical_step({"q40-s50": 2}, VERTICAL_OPTIONS, 41) is None  # the largest quota adds 40
    assert vertical_step({"q10-s6": 3}, VERTICAL_OPTIONS, 1) is None  # no larger quota at SM 6
    # a configuration that already runs is no target (its pods would merge with another child's)
    mixed = vertical_step({"q20-s50": 1, "q40-s50": 1}, VERTICAL_OPTIONS, 10)
    assert mixed is not None
    assert (mixed.source, mixed.target) == (usable["q20-s50"], usable["q80-s50"])


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 300), st.dictionaries(st.sampled_from(sorted(VERTICAL_BY_KEY)), st.integers(0, 6)))
def test_scaling_up_with_vertical_steps_covers_the_target_and_removes_no_pod(rate: float,
                                                                            pods: dict[str, int]) -> None:
    before = ScalerState(pods=pods, last_up_s=0)  # scaled a moment ago: no re-plan now
    after = step(before, VERTICAL_OPTIONS, rate_long=rate, rate_short=0, now_s=1, settings=SETTINGS)
    assert after.capacity(VERTICAL_BY_KEY) >= rate * 1.5 - 1e-6
    if after.capacity(VERTICAL_BY_KEY) > before.capacity(VERTICAL_BY_KEY) + 1e-9:
        assert sum(after.pods.values()) >= sum(pods.values())
        for sm in {VERTICAL_BY_KEY[k].point.sm_partition for k in pods}:  # a vertical step keeps the SM
            def at(state: ScalerState, sm: int = sm) -> int:
                return sum(n for k, n in state.pods.items() if VERTICAL_BY_KEY[k].point.sm_partition == sm)
            assert at(after) >= at(before)


REPLAN = ScalingSettings(headroom=0.5, scale_down_delay_s=60, dead_band=0.25, rebalance_interval_s=300,
                         rebalance_gain=0.15)


def test_a_patchwork_is_re_planned_make_before_break_when_it_saves_enough() -> None:
    # six small pods and one medium (34 req/s for 0.625 of a GPU) do what one larger pod (40 for 0.4) does
    patchwork = ScalerState(pods={"q10-s6": 6, "q20-s50": 1}, last_up_s=0, last_down_s=0)
    by_key = VERTICAL_BY_KEY
    new = step(patchwork, VERTICAL_OPTIONS, rate_long=18, rate_short=0, now_s=400, settings=REPLAN)
    ideal = {c.option.point.key: c.replicas for c in plan(27, VERTICAL_OPTIONS).configs}
    assert new.pods == ideal
    assert new.last_rebalance_s == 400
    assert sum(by_key[k].cost * n for k, n in ideal.items()) <= 0.85 * (6 * by_key["q10-s6"].cost + 0.25)
    assert new.keep == patchwork.pods  # the old pods run on until the new ones are ready
    assert running(new) == {k: max(new.pods.get(k, 0), patchwork.pods.get(k, 0))
                            for k in set(new.pods) | set(patchwork.pods)}
    assert settle(new, {k: n - 1 for k, n in ideal.items()}).keep == patchwork.pods  # one not ready yet
    settled = settle(new, ideal)
    assert settled.keep == {}
    assert running(settled) == ideal
    # no second re-plan while one is under way, nor within the interval after it
    assert step(new, VERTICAL_OPTIONS, rate_long=18, rate_short=0, now_s=401, settings=REPLAN) == new
    later = step(settled, VERTICAL_OPTIONS, rate_long=3, rate_short=0, now_s=402, settings=REPLAN)
    assert later.last_rebalance_s == 400


def test_no_vertical_step_while_a_re_plans_old_pods_run() -> None:
    replanning = ScalerState(pods={"q20-s50": 2}, keep={"q40-s50": 1}, last_rebalance_s=0)
    after = step(replanning, VERTICAL_OPTIONS, rate_long=24, rate_short=0, now_s=5, settings=SETTINGS)
    assert after.pods["q20-s50"] == 2  # pods added, none raised to a configuration the kept pods run
    assert after.keep == {"q40-s50": 1}


def test_no_re_plan_while_a_pod_starts_too_soon_after_a_scale_or_for_a_small_saving() -> None:
    patchwork = ScalerState(pods={"q10-s6": 6, "q20-s50": 1}, last_up_s=0, last_down_s=0)
    assert step(patchwork, VERTICAL_OPTIONS, rate_long=18, rate_short=0, now_s=400, settings=REPLAN,
                starting=True) == patchwork
    recent = ScalerState(pods=patchwork.pods, last_up_s=380)
    assert step(recent, VERTICAL_OPTIONS, rate_long=18, rate_short=0, now_s=400, settings=REPLAN).pods == patchwork.pods
    greedy = ScalingSettings(headroom=0.5, scale_down_delay_s=60, rebalance_gain=0.9)
    assert step(patchwork, VERTICAL_OPTIONS, rate_long=18, rate_short=0, now_s=400, settings=greedy).keep == {}


# --- the HPA baseline ----------------------------------------------------------------------
def test_hpa_scales_up_by_at_most_double_or_four_and_down_after_its_stabilisation_window() -> None:
    settings = HpaSettings(min_pods=1, max_pods=50)
    state = hpa_step(HpaState(pods=1), rate=0, pod_rps=10, now_s=0, settings=settings)
    assert state.pods == 1
    state = hpa_step(state, rate=200, pod_rps=10, now_s=15, settings=settings)  # wants ceil(200 / 7) = 29
    assert state.pods == 5  # 1 + 4
    state = hpa_step(state, rate=200, pod_rps=10, now_s=30, settings=settings)
    assert state.pods == 10  # doubled
    assert hpa_step(state, rate=72, pod_rps=10, now_s=45, settings=settings).pods == 10  # the window holds
    # within the tolerance (|72 / (10 x 7) - 1| <= 0.1): no change, even without the window
    assert hpa_step(HpaState(pods=10), rate=72, pod_rps=10, now_s=45, settings=settings).pods == 10
    later = state
    for now in (45, 60, 345):
        later = hpa_step(later, rate=7, pod_rps=10, now_s=now, settings=settings)
    assert later.pods == 1  # 300 s after the last recommendation of 29
    assert hpa_step(HpaState(pods=3), rate=1000, pod_rps=10, now_s=0,
                    settings=HpaSettings(max_pods=4)).pods == 4
    with pytest.raises(PlanError, match="a pod's throughput must be a positive number"):
        hpa_step(HpaState(), rate=1, pod_rps=0, now_s=0)
