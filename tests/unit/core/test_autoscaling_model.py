"""The planner with model sharing: a point's memoryBytes is the pod's own memory, and the function's
weights are held once on every GPU its pods use (as the extender charges them)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastgshare.autoscaling import GpuBudget, cost_of, options, plan, plan_gpus, plan_memory_bytes
from fastgshare.profile import ProfilePoint, Slo

GiB = 2**30
SLO = Slo(percentile=95, latency_ms=100)


def point(memory: int, *, quota: float = 0.1, sm: int = 10, rps: float = 10) -> ProfilePoint:
    return ProfilePoint(quota_request=quota, quota_limit=quota, sm_partition=sm, memory_bytes=memory, max_rps=rps,
                        p95_ms=50)


def test_without_a_model_nothing_changes() -> None:
    gpu = GpuBudget(memory_bytes=16 * GiB, slots=16)
    assert gpu.pods_memory_bytes == 16 * GiB
    assert cost_of(point(4 * GiB), gpu) == pytest.approx(4 / 16)


def test_a_pods_memory_share_is_of_the_gpu_less_one_copy_of_the_weights() -> None:
    gpu = GpuBudget(memory_bytes=16 * GiB, slots=16, context_reserve_bytes=GiB // 2, model_bytes=6 * GiB)
    # 1.5 GiB own + 0.5 GiB context per pod; 10 GiB of the GPU left next to the weights: 5 pods a GPU
    assert cost_of(point(3 * GiB // 2), gpu) == pytest.approx(2 / 10)


def test_a_point_fits_only_next_to_the_weights() -> None:
    gpu = GpuBudget(memory_bytes=16 * GiB, model_bytes=10 * GiB)
    assert [o.point.memory_bytes for o in options([point(6 * GiB), point(7 * GiB)], SLO, gpu)] == [6 * GiB]
    too_big = GpuBudget(memory_bytes=16 * GiB, model_bytes=16 * GiB)
    assert options([point(GiB)], SLO, too_big) == []
    assert cost_of(point(GiB), too_big) == math.inf


def test_the_plans_memory_holds_the_weights_once_per_gpu_it_uses() -> None:
    gpu = GpuBudget(memory_bytes=16 * GiB, slots=16, model_bytes=6 * GiB)
    usable = options([point(2 * GiB)], SLO, gpu)  # 5 pods a GPU by memory; 10 req/s each within the SLO
    result = plan(120, usable)
    assert result.replicas == 12
    assert plan_gpus(result) == 3  # 12 pods of 2 GiB: 24 GiB, 10 GiB of each GPU next to the weights
    assert plan_memory_bytes(result, gpu) == 12 * 2 * GiB + 3 * 6 * GiB
    assert plan_memory_bytes(plan(0, usable), gpu) == 0


@given(own=st.integers(1, 8), weights=st.integers(0, 7), pods=st.integers(1, 40))
def test_a_memory_bound_plan_costs_what_packing_the_pods_next_to_one_copy_per_gpu_takes(
        own: int, weights: int, pods: int) -> None:
    """By memory, a GPU holds the weights once and floor((M - w) / own) pods: the plan's GPUs are at
    most that packing's count, and the memory it reports fits in them."""
    gpu = GpuBudget(memory_bytes=16 * GiB, slots=64, model_bytes=weights * GiB)
    if own + weights > 16:
        assert options([point(own * GiB, quota=0.01, sm=1)], SLO, gpu) == []
        return
    usable = options([point(own * GiB, quota=0.01, sm=1)], SLO, gpu)
    result = plan(pods * 10, usable)
    assert result.replicas == pods
    per_gpu = (16 - weights) // own
    assert plan_gpus(result) <= math.ceil(pods / per_gpu)
    assert plan_gpus(result) * 16 * GiB >= plan_memory_bytes(result, gpu) - GiB // 1024  # rounding
