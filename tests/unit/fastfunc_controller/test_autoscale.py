"""The autoscaler's pure decisions: which configurations a profile allows, the scaler's pods as the
child FaSTPods' writes, the scale-down delay and the clamp."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest

from fastfunc_controller.autoscale import (
    ProfileUnusable,
    desired_configs,
    hold,
    pods_of,
    start,
    tick,
    usable_configs,
)
from fastfunc_controller.plan import CreateFaSTPod, DeleteFaSTPod, PatchFaSTPod, desired_fastpod, plan
from fastfunc_controller.rates import Rates
from fastfunc_controller.spec import FunctionSpec, parse_function
from fastgshare.autoscaling import ScalerState

PROFILE = (Path(__file__).resolve().parents[3] / "examples" / "profile-resnet50.json").read_text()
CONFIGMAP = {"data": {"profile.json": PROFILE}}


def spec(**scaling: Any) -> FunctionSpec:
    return parse_function({"metadata": {"name": "resnet", "namespace": "fn", "uid": "u1"},
                           "spec": {"podSpec": {"containers": [{"name": "fn", "image": "x"}]}, "memory": "2Gi",
                                    "slo": {"latencyMs": 69}, "profile": {"configMapRef": {"name": "p"}},
                                    "scaling": {"policy": "rpr", **scaling}}})


def test_rpr_may_use_every_slo_feasible_point_within_the_allow_list_and_hpa_only_the_whole_gpu() -> None:
    every = usable_configs(spec(), CONFIGMAP)
    assert len(every.choices) > 1
    assert all(choice.option.capacity_rps > 0 for choice in every.choices)
    effs = [choice.option.efficiency for choice in every.choices]
    assert effs == sorted(effs, reverse=True)
    only = usable_configs(spec(configs={"sm": [100]}), CONFIGMAP)
    assert {choice.share.sm_percent for choice in only.choices} == {100}
    [whole] = usable_configs(spec(policy="hpa"), CONFIGMAP).choices
    assert whole.label == "q100-s100"


@pytest.mark.parametrize(("configmap", "reason", "says"), [
    (None, "ProfileNotFound", "does not exist"),
    ({"data": {}}, "ProfileNotFound", "has no key profile.json"),
    ({"data": {"profile.json": '{"version": 2}'}}, "ProfileInvalid", "profile.version: 2 is not understood"),
    ({"data": {"profile.json": json.dumps({**json.loads(PROFILE), "points": [
        p for p in json.loads(PROFILE)["points"] if p["quotaRequest"] < 1]})}}, "ProfileInvalid",
     "policy hpa needs the whole-GPU point"),
])
def test_an_unusable_profile_says_why(configmap: dict[str, Any] | None, reason: str, says: str) -> None:
    with pytest.raises(ProfileUnusable) as caught:
        usable_configs(spec(policy="hpa"), configmap)
    assert caught.value.reason == reason
    assert says in str(caught.value)


def test_an_slo_no_point_meets_is_refused() -> None:
    with pytest.raises(ProfileUnusable, match=r"no configuration meets the SLO \(p95 <= 1 ms\)"):
        usable_configs(parse_function({"metadata": {"name": "f", "namespace": "fn"}, "spec": {
            "podSpec": {"containers": [{"name": "fn"}]}, "memory": "2Gi", "slo": {"latencyMs": 1},
            "profile": {"configMapRef": {"name": "p"}}, "scaling": {"policy": "rpr"}}}), CONFIGMAP)


def children_of(function: FunctionSpec, pods: dict[str, int]) -> list[dict[str, Any]]:
    usable = usable_configs(function, CONFIGMAP)
    return [{**desired_fastpod(function, config), "metadata": {**desired_fastpod(function, config)["metadata"],
                                                                "uid": config.label}}
            for config in desired_configs(usable, pods, function.memory)]


def test_the_scalers_pods_become_creates_patches_and_deletes_of_the_children() -> None:
    function = spec()
    usable = usable_configs(function, CONFIGMAP)
    first, second = usable.choices[0].key, usable.choices[1].key
    children = children_of(function, {first: 2, second: 1})
    assert start(usable, children, 0.0) == ScalerState(pods={first: 2, second: 1}, last_up_s=0.0)
    wanted = {first: 3}  # second goes to 0: its FaSTPod is deleted
    actions = plan(attrs.evolve(function, configs=desired_configs(usable, wanted, "2Gi")),
                   children, service={"metadata": {"ownerReferences": []}})
    kinds = [(type(a).__name__, getattr(a, "name", "")) for a in actions]
    second_name = f"resnet-{usable.choices[1].label}"
    assert kinds == [("DeleteFaSTPod", second_name), ("PatchFaSTPod", f"resnet-{usable.choices[0].label}")]
    assert isinstance(actions[0], DeleteFaSTPod)
    assert isinstance(actions[1], PatchFaSTPod)
    assert actions[1].what == "replicas 2 -> 3"
    actions = plan(attrs.evolve(function, configs=desired_configs(usable, {second: 1}, "2Gi")),
                   [], service={"metadata": {"ownerReferences": []}})
    assert [type(a) for a in actions] == [CreateFaSTPod]


def test_scale_down_waits_for_the_delay_and_the_clamp_keeps_min_and_max() -> None:
    function = spec(minReplicas=2, maxReplicas=5, scaleDownDelaySeconds=30, headroom=0)
    usable = usable_configs(function, CONFIGMAP)
    state = start(usable, [], 0.0)
    state = hold(function, usable, state)  # no rate: the minimum
    assert sum(pods_of(usable, state).values()) == 2
    up = tick(function, usable, state, Rates(long=1000, short=1000), 1.0).state
    assert sum(pods_of(usable, up).values()) == 5  # clamped to maxReplicas
    assert tick(function, usable, up, Rates(long=0, short=0), 30.0).state == up  # 29 s after the scale-up
    down = tick(function, usable, up, Rates(long=0, short=0), 31.0).state
    assert sum(pods_of(usable, down).values()) == 2  # down to minReplicas, not below
