"""Parked pods (``spec.scaling.parked``) in the function controller: a function scaled to zero keeps
its pods parked in place (time quota 0/0, memory held), the status says what they wake to and what
they hold, a pod woken by the gateway is taken as running, and a request the controller sees first
wakes the parked child in place rather than starting a pod."""

from __future__ import annotations

from typing import Any

import pytest

from fastfunc_controller.rates import Rates
from fastfunc_controller.spec import InvalidFunction, parse_function
from fastgshare import keys
from fastgshare.codec import PodAssignment, encode_assignment
from tests.builders import make_share
from tests.unit.fastfunc_controller.test_autoscaling_controller import Harness, fastfunc

WAKE = {keys.GPU_QUOTA_REQUEST, keys.GPU_QUOTA_LIMIT}


def children(run: Harness) -> dict[str, dict[str, Any]]:
    return {child["metadata"]["name"]: child for child in run.made.fastpods.select(namespace="fn")}


def quota(child: dict[str, Any]) -> tuple[str, str]:
    annotations = child["metadata"]["annotations"]
    return annotations[keys.GPU_QUOTA_REQUEST], annotations[keys.GPU_QUOTA_LIMIT]


def scaled_to_zero(run: Harness) -> str:
    """Run one pod, then no load past the delay; returns the name of the child that served."""
    run.at(0, Rates(long=1, short=1))
    (name,) = run.at_now()
    run.at(2, Rates(long=0, short=0))
    run.at(70)
    run.at(70.5)  # the watch's reconcile after the write: the status shows the parked child
    return name


def woken_by_gateway(run: Harness, name: str) -> dict[str, Any]:
    """What the gateway writes to the parked child ``name``: the wake quota and the woken mark."""
    wake = run.status["parked"]
    child = children(run)[name]
    child["metadata"]["annotations"].update({keys.GPU_QUOTA_REQUEST: wake["wakeQuotaRequest"],
                                             keys.GPU_QUOTA_LIMIT: wake["wakeQuotaLimit"],
                                             keys.FASTPOD_WOKEN_ANNOTATION: "2026-01-01T00:01:11Z"})
    run.made.fastpods.upsert(child)
    return child


def test_a_function_scaled_to_zero_parks_its_pod_in_place_and_says_what_it_holds() -> None:
    run = Harness(fastfunc(minReplicas=0, parked=1))
    name = scaled_to_zero(run)
    serving = quota(children(run)[name]) if name in children(run) else None
    assert list(children(run)) == [name]  # the same child: its pod keeps running, its model loaded
    assert serving == ("0", "0")
    child = children(run)[name]
    assert child["spec"]["replicas"] == 1
    assert child["metadata"]["annotations"][keys.GPU_MEM] == "2Gi"
    status = run.status
    assert (status["replicas"], status["parkedReplicas"]) == (0, 1)
    assert status["configSummary"].startswith("parked-s")
    parked = status["parked"]
    assert parked["fastPod"] == name
    assert name.endswith(f"-q{float(parked['wakeQuotaRequest']) * 100:g}-s{parked['smPartition']}")
    assert parked["memoryBytes"] == 2 * 2**30
    assert float(parked["wakeQuotaLimit"]) >= float(parked["wakeQuotaRequest"]) > 0


def test_without_parked_the_function_scales_to_zero_as_before() -> None:
    run = Harness(fastfunc(minReplicas=0))
    scaled_to_zero(run)
    assert run.at_now() == {}
    assert run.status["parkedReplicas"] == 0
    assert "parked" not in run.status or run.status["parked"] is None


def test_a_new_function_starts_parked_named_for_the_configuration_it_wakes_to() -> None:
    run = Harness(fastfunc(minReplicas=0, parked=2))
    run.at(0, Rates(long=0, short=0))
    run.at(0.5)
    ((name, child),) = children(run).items()
    assert quota(child) == ("0", "0")
    assert child["spec"]["replicas"] == 2
    config = child["metadata"]["labels"][keys.FUNCTION_CONFIG_LABEL]
    assert name == f"resnet-{config}"
    assert config.startswith("q")
    assert run.status["parked"]["fastPod"] == name


def test_pods_the_gateway_woke_are_taken_as_running_and_not_parked_again() -> None:
    run = Harness(fastfunc(minReplicas=0, parked=1))
    name = scaled_to_zero(run)
    wake = run.status["parked"]
    woken_by_gateway(run, name)
    run.at(71)  # the change's reconcile, before the next tick reads a rate
    after = children(run)[name]
    assert quota(after) == (wake["wakeQuotaRequest"], wake["wakeQuotaLimit"])
    assert keys.FASTPOD_WOKEN_ANNOTATION not in after["metadata"]["annotations"]  # taken: the mark goes
    assert [e["message"] for e in run.kube.events if e["reason"] == "Woken"] == [
        f"The gateway woke the parked pods for a request: {name.removeprefix('resnet-')}x1 runs"]
    run.at(71.5)
    assert run.status["parkedReplicas"] == 0
    assert run.status["configSummary"].startswith("q")
    assert run.status.get("parked") is None
    assert quota(children(run)[name]) != ("0", "0")
    run.at(72, Rates(long=0, short=0))
    assert quota(children(run)[name]) != ("0", "0")  # woken pods stay within the scale-down delay
    run.at(133)
    assert quota(children(run)[name]) == ("0", "0")  # and are parked again after it


def test_a_rate_the_controller_sees_first_wakes_the_parked_child_in_place() -> None:
    run = Harness(fastfunc(minReplicas=0, parked=1))
    name = scaled_to_zero(run)
    wake = run.status["parked"]
    run.at(72, Rates(long=1, short=1))
    assert list(children(run)) == [name]
    assert quota(children(run)[name]) == (wake["wakeQuotaRequest"], wake["wakeQuotaLimit"])


@pytest.mark.parametrize(("scaling", "message"), [
    ({"minReplicas": 1, "parked": 1},
     "spec.scaling.parked: 1 needs spec.scaling.minReplicas 0 (it is 1); allowed: parked pods only for a "
     "function that scales to zero"),
    ({"minReplicas": 0, "parked": -1},
     "spec.scaling.parked: -1 is not allowed; allowed: a whole number of pods, 0..16 (at most maxReplicas and 16)"),
    ({"minReplicas": 0, "maxReplicas": 2, "parked": 3},
     "spec.scaling.parked: 3 is not allowed; allowed: a whole number of pods, 0..2 (at most maxReplicas and 16)"),
    ({"minReplicas": 0, "parked": "1"},
     "spec.scaling.parked: '1' is not allowed; allowed: a whole number of pods, 0..16 (at most maxReplicas and 16)"),
])
def test_a_bad_parked_count_is_one_line_naming_the_field(scaling: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidFunction) as caught:
        parse_function(fastfunc(**scaling))
    assert str(caught.value) == message


def test_a_fixed_share_of_no_time_is_refused_and_points_to_parked() -> None:
    obj = fastfunc()
    obj["spec"]["scaling"] = {"policy": "fixed"}
    obj["spec"]["fixed"] = {"quotaRequest": "0", "quotaLimit": "0"}
    with pytest.raises(InvalidFunction, match=r'spec.fixed.quotaLimit: "0" gives the pods no GPU time; .*'
                                              r"spec.scaling.parked"):
        parse_function(obj)


def test_a_pod_woken_without_its_request_gets_one_more_pod_of_its_configuration_once() -> None:
    run = Harness(fastfunc(minReplicas=0, parked=1))
    name = scaled_to_zero(run)
    wake = run.status["parked"]
    child = woken_by_gateway(run, name)
    run.at(71)
    assert children(run)[name]["spec"]["replicas"] == 1
    share = make_share(0, int(float(wake["wakeQuotaLimit"]) * 1000), wake["smPartition"], 2 << 30)
    assignment = encode_assignment(PodAssignment(node_name="n", gpu_uuid="GPU-0", gpu_index=0, share=share,
                                                 assigned_at_ms=1))
    run.made.pods.upsert({"metadata": {"name": f"{name}-abcde", "namespace": "fn", "uid": "pod-1",
                                       "labels": {keys.FUNCTION_LABEL: "resnet"},
                                       "annotations": {keys.POD_ASSIGNMENT_ANNOTATION: assignment},
                                       "ownerReferences": [{"kind": keys.FASTPOD_KIND, "controller": True,
                                                            "uid": child["metadata"]["uid"], "name": name}]}})
    run.at(71.5)
    assert children(run)[name]["spec"]["replicas"] == 2  # one more, placed by the extender where there is room
    run.at(72)
    assert children(run)[name]["spec"]["replicas"] == 2  # once per pod
    assert any("without their time quota request" in e["message"] for e in run.kube.events)
