"""What the gateway reads from a FaSTFunc and its scale-from-zero decisions (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from fastgshare_gateway.fastfunc import FunctionSettings, Hold, on_idle, scale_problem, settings_of, wake_patch


def fastfunc(scaling: dict[str, Any] | None = None, fixed: dict[str, Any] | None = None,
             slo: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"podSpec": {"containers": [{"name": "c", "image": "i"}]}}
    for field, value in (("scaling", scaling), ("fixed", fixed), ("slo", slo)):
        if value is not None:
            spec[field] = value
    return {"metadata": {"name": "fn", "namespace": "ns"}, "spec": spec}


def test_settings_are_read_with_the_crd_defaults() -> None:
    assert settings_of(fastfunc()) == FunctionSettings(min_replicas=1, policy="fixed", replicas=None, slo_s=None)
    read = settings_of(fastfunc({"minReplicas": 0, "policy": "rpr"}, {"replicas": 0}, {"latencyMs": 250}))
    assert read == FunctionSettings(min_replicas=0, policy="rpr", replicas=0, slo_s=0.25)
    assert read.scales_from_zero
    # malformed fields read as their defaults
    bad = settings_of(fastfunc({"minReplicas": "0"}, {"replicas": -1}, {"latencyMs": True}))
    assert bad == FunctionSettings()


def test_a_scale_from_zero_function_is_held_and_woken_once() -> None:
    zero = settings_of(fastfunc({"minReplicas": 0}, {"replicas": 0}))
    assert on_idle(zero, waking=False, cold_start_timeout_s=120) == Hold(120, {"spec": {"fixed": {"replicas": 1}}})
    assert on_idle(zero, waking=True, cold_start_timeout_s=120) == Hold(120, None)  # one already on its way
    # pods already asked for (woken, or scaled up by hand): held, never patched down
    starting = settings_of(fastfunc({"minReplicas": 0}, {"replicas": 3}))
    assert on_idle(starting, waking=False, cold_start_timeout_s=5) == Hold(5, None)
    # an autoscaled function's replicas are not the gateway's to set
    autoscaled = settings_of(fastfunc({"minReplicas": 0, "policy": "rpr"}, {"replicas": 0}))
    assert on_idle(autoscaled, waking=False, cold_start_timeout_s=5) == Hold(5, None)


@pytest.mark.parametrize("settings", [None, FunctionSettings(min_replicas=1, replicas=0),
                                      FunctionSettings(min_replicas=2)])
def test_other_functions_wait_the_queue_timeout(settings: FunctionSettings | None) -> None:
    assert on_idle(settings, waking=False, cold_start_timeout_s=120) is None


def test_the_wake_up_asks_for_at_least_one_replica() -> None:
    assert wake_patch(FunctionSettings(min_replicas=0)) == {"spec": {"fixed": {"replicas": 1}}}
    assert wake_patch(FunctionSettings(min_replicas=3)) == {"spec": {"fixed": {"replicas": 3}}}


def test_scaling_to_zero_needs_min_replicas_zero() -> None:
    assert scale_problem(fastfunc({"minReplicas": 0}), "fn", 0) is None
    assert scale_problem(fastfunc({"minReplicas": 2}), "fn", 1) is None
    problem = scale_problem(fastfunc(), "fn", 0)
    assert problem is not None
    assert "minReplicas is 1" in problem
    assert "\n" not in problem
