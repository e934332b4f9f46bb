"""The function controller's pure core: a FaSTFunc validated, planned into writes, and its status."""

from __future__ import annotations

import copy
from typing import Any

import attrs
import pytest

from fastfunc_controller.plan import (
    CreateFaSTPod,
    CreateService,
    DeleteFaSTPod,
    PatchFaSTPod,
    PatchService,
    compute_status,
    desired_fastpod,
    desired_service,
    plan,
    pod_summary,
    unschedulable,
)
from fastfunc_controller.spec import InvalidFunction, parse_function
from fastgshare import keys

UID = "uid-fn"
POD_SPEC = {"containers": [{"name": "fn", "image": "example/fn:1", "ports": [{"containerPort": 8080}]}]}


def fastfunc(name: str = "resnet", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"podSpec": copy.deepcopy(POD_SPEC), "memory": "2Gi",
                            "fixed": {"quotaRequest": "0.4", "smPartition": 12, "replicas": 2}}
    body.update(spec)
    return {"apiVersion": keys.FASTFUNC_API_VERSION, "kind": keys.FASTFUNC_KIND,
            "metadata": {"name": name, "namespace": "fn", "uid": UID, "generation": 3}, "spec": body}


def existing(body: dict[str, Any], uid: str = "uid-child", **status: Any) -> dict[str, Any]:
    """A child as the cache holds it: what was created, plus a uid and a status."""
    child = copy.deepcopy(body)
    child["metadata"]["uid"] = uid
    child["status"] = status
    return child


def only_child(obj: dict[str, Any]) -> dict[str, Any]:
    spec = parse_function(obj)
    [config] = spec.configs
    return desired_fastpod(spec, config)


def test_a_fixed_function_gets_its_fastpod_and_service() -> None:
    spec = parse_function(fastfunc())
    actions = plan(spec, [], None)
    assert [type(a) for a in actions] == [CreateFaSTPod, CreateService]
    fastpod = actions[0].body  # type: ignore[union-attr]
    assert fastpod["metadata"]["name"] == "resnet-q40-s12"
    labels = {keys.FUNCTION_LABEL: "resnet", keys.OPENFAAS_FUNCTION_LABEL: "resnet",
              keys.FUNCTION_CONFIG_LABEL: "q40-s12"}
    assert fastpod["metadata"]["labels"] == labels
    assert fastpod["metadata"]["annotations"] == {keys.GPU_QUOTA_REQUEST: "0.4", keys.GPU_QUOTA_LIMIT: "0.4",
                                                  keys.GPU_SM_PARTITION: "12", keys.GPU_MEM: "2Gi"}
    assert fastpod["metadata"]["ownerReferences"] == [{
        "apiVersion": keys.FASTFUNC_API_VERSION, "kind": "FaSTFunc", "name": "resnet", "uid": UID,
        "controller": True, "blockOwnerDeletion": True}]
    assert fastpod["spec"] == {"replicas": 2, "podSpec": POD_SPEC, "selector": {"matchLabels": {
        keys.FUNCTION_LABEL: "resnet", keys.FUNCTION_CONFIG_LABEL: "q40-s12"}}}
    service = actions[1].body  # type: ignore[union-attr]
    assert service["metadata"]["name"] == "resnet"
    assert service["spec"]["selector"] == {keys.FUNCTION_LABEL: "resnet"}
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [(keys.FUNCTION_PORT,) * 2]


def test_the_function_labels_and_inherited_annotations_reach_the_fastpod() -> None:
    obj = fastfunc()
    obj["metadata"]["labels"] = {"team": "vision", keys.FUNCTION_LABEL: "forged"}
    obj["metadata"]["annotations"] = {keys.GPU_CONTAINERS_ANNOTATION: "fn", "note": "not inherited"}
    fastpod = only_child(obj)
    assert fastpod["metadata"]["labels"]["team"] == "vision"
    assert fastpod["metadata"]["labels"][keys.FUNCTION_LABEL] == "resnet"
    assert fastpod["metadata"]["annotations"][keys.GPU_CONTAINERS_ANNOTATION] == "fn"
    assert "note" not in fastpod["metadata"]["annotations"]


def test_nothing_to_do_when_the_children_are_as_desired() -> None:
    spec = parse_function(fastfunc())
    service = existing(desired_service(spec), uid="uid-svc")
    service["spec"]["clusterIP"] = "10.0.0.7"  # what the API server adds is not ours to undo
    service["spec"]["ports"][0]["targetPort"] = 8080
    assert plan(spec, [existing(only_child(fastfunc()))], service) == []


def test_a_replica_change_patches_spec_replicas_only() -> None:
    child = existing(only_child(fastfunc()))
    spec = parse_function(fastfunc(fixed={"quotaRequest": "0.4", "smPartition": 12, "replicas": 5}))
    [patch] = plan(spec, [child], existing(desired_service(spec)))
    assert isinstance(patch, PatchFaSTPod)
    assert patch.name == "resnet-q40-s12"
    assert patch.operations == ({"op": "test", "path": "/metadata/uid", "value": "uid-child"},
                                {"op": "add", "path": "/spec/replicas", "value": 5})
    assert patch.what == "replicas 2 -> 5"


def test_a_share_change_replaces_the_fastpod() -> None:
    child = existing(only_child(fastfunc()))
    spec = parse_function(fastfunc(fixed={"quotaRequest": "0.4", "smPartition": 24, "replicas": 2}))
    actions = plan(spec, [child], existing(desired_service(spec)))
    assert actions[0] == DeleteFaSTPod("resnet-q40-s12", "uid-child")
    assert isinstance(actions[1], CreateFaSTPod)
    assert actions[1].body["metadata"]["name"] == "resnet-q40-s24"
    assert len(actions) == 2


def test_a_limit_or_memory_change_keeps_the_fastpod_and_patches_its_annotations() -> None:
    child = existing(only_child(fastfunc()))
    spec = parse_function(fastfunc(memory="3Gi", fixed={"quotaRequest": "0.4", "quotaLimit": "0.8",
                                                        "smPartition": 12, "replicas": 2}))
    [patch] = plan(spec, [child], existing(desired_service(spec)))
    assert isinstance(patch, PatchFaSTPod)
    assert patch.operations[1:] == (
        {"op": "add", "path": "/metadata/annotations/fastgshare~1gpu_mem", "value": "3Gi"},
        {"op": "add", "path": "/metadata/annotations/fastgshare~1gpu_quota_limit", "value": "0.8"})


def test_a_pod_spec_change_is_patched_onto_the_fastpod() -> None:
    child = existing(only_child(fastfunc()))
    pod_spec = {"containers": [{"name": "fn", "image": "example/fn:2"}]}
    [patch] = plan(parse_function(fastfunc(podSpec=pod_spec)), [child], None)[:1]
    assert isinstance(patch, PatchFaSTPod)
    assert patch.operations[1:] == ({"op": "add", "path": "/spec/podSpec", "value": pod_spec},)


def test_a_service_changed_by_hand_is_put_back_but_a_foreign_one_is_left_alone() -> None:
    spec = parse_function(fastfunc())
    ours = existing(desired_service(spec))
    ours["spec"]["selector"] = {"app": "other"}
    [patch] = plan(spec, [existing(only_child(fastfunc()))], ours)
    assert patch == PatchService("resnet", {"spec": {"selector": {"app": None, keys.FUNCTION_LABEL: "resnet"}}})
    foreign = copy.deepcopy(ours)
    foreign["metadata"]["ownerReferences"][0]["uid"] = "someone-else"
    assert plan(spec, [existing(only_child(fastfunc()))], foreign) == []


@pytest.mark.parametrize(("quota", "sm", "name"), [("0.125", 6, "resnet-q12.5-s6"), ("1", 100, "resnet-q100-s100"),
                                                   ("0", 50, "resnet-q0-s50"), (".40", 12, "resnet-q40-s12")])
def test_the_child_name_is_the_quota_and_sm_in_percent(quota: str, sm: int, name: str) -> None:
    fixed = {"quotaRequest": quota, "quotaLimit": "1", "smPartition": sm}
    assert only_child(fastfunc(fixed=fixed))["metadata"]["name"] == name


@pytest.mark.parametrize(("fixed", "memory", "message"), [
    ({"quotaRequest": "0.4", "smPartition": 150}, "2Gi",
     'spec.fixed.smPartition: "150" is out of range; allowed: an integer percent of the SMs, 1..100 (e.g. "50")'),
    ({"quotaRequest": "1.5"}, "2Gi",
     'spec.fixed.quotaRequest: "1.5" is out of range; allowed: a decimal fraction of GPU time, 0 <= request <= 1 '
     '(e.g. "0.4")'),
    ({"quotaRequest": "0.6", "quotaLimit": "0.3"}, "2Gi",
     'spec.fixed.quotaRequest: request "0.6" is greater than spec.fixed.quotaLimit "0.3"; allowed: request <= limit'),
    ({"quotaRequest": "0.4"}, "lots",
     'spec.memory: "lots" is not a byte count; allowed: a positive whole number of bytes, e.g. "2700000000", '
     '"1536Mi" or "1.5Gi"'),
    ({"smPartition": 10}, "2Gi",
     'spec.fixed.quotaRequest: is required; allowed: a decimal fraction of GPU time, 0 <= request <= 1 (e.g. "0.4")'),
])
def test_a_bad_share_names_the_field_the_value_and_what_is_allowed(fixed: dict[str, Any], memory: str,
                                                                   message: str) -> None:
    with pytest.raises(InvalidFunction) as caught:
        parse_function(fastfunc(fixed=fixed, memory=memory))
    assert str(caught.value) == message
    assert caught.value.reason == "InvalidShare"


def test_a_defaulted_limit_says_where_its_value_came_from() -> None:
    with pytest.raises(InvalidFunction, match=r"spec.fixed.quotaLimit \(defaults to spec.fixed.quotaRequest\): "):
        parse_function(fastfunc(fixed={"quotaRequest": "0"}))


def test_a_name_whose_fastpod_name_is_too_long_is_refused() -> None:
    name = "f" * 54
    with pytest.raises(InvalidFunction) as caught:
        parse_function(fastfunc(name=name, fixed={"quotaRequest": "0.125", "smPartition": 12}))
    assert caught.value.reason == "InvalidName"
    assert str(caught.value).startswith(f'metadata.name: "{name}" is too long: its FaSTPod "{name}-q12.5-s12" has 64 '
                                        "characters; allowed: at most 63, so a name of at most 53 characters")


def test_a_name_that_cannot_name_a_service_is_refused() -> None:
    with pytest.raises(InvalidFunction, match=r'metadata.name: "1st.fn" cannot name the function\'s Service'):
        parse_function(fastfunc(name="1st.fn"))


def test_policy_fixed_needs_spec_fixed() -> None:
    obj = fastfunc()
    del obj["spec"]["fixed"]
    with pytest.raises(InvalidFunction, match=r"^spec.fixed: is required with policy fixed"):
        parse_function(obj)


def test_an_autoscaling_policy_without_a_profile_runs_the_whole_gpu_and_says_profile_missing() -> None:
    obj = fastfunc(scaling={"policy": "rpr", "minReplicas": 3})
    del obj["spec"]["fixed"]
    spec = parse_function(obj)
    [config] = spec.configs
    assert (config.label, config.replicas) == ("q100-s100", 3)
    status = compute_status(obj, spec, [], "T0")
    [missing] = [c for c in status["conditions"] if c["type"] == "ProfileMissing"]
    assert (missing["status"], missing["reason"]) == ("True", "ProfileMissing")
    assert "whole-GPU configuration (quota 1, SM 100) with 3 replicas" in missing["message"]


def test_an_autoscaling_policy_without_a_profile_runs_spec_fixed_when_given() -> None:
    spec = parse_function(fastfunc(scaling={"policy": "hpa"}))
    assert [config.label for config in spec.configs] == ["q40-s12"]
    assert spec.fallback.endswith("running spec.fixed")


def test_status_counts_the_childrens_pods_and_ready_follows_them() -> None:
    obj = fastfunc()
    child = existing(only_child(obj), replicas=2, readyReplicas=1)
    status = compute_status(obj, parse_function(obj), [child], "T0")
    assert {k: status[k] for k in ("observedGeneration", "policy", "replicas", "readyReplicas", "configSummary")} == {
        "observedGeneration": 3, "policy": "fixed", "replicas": 2, "readyReplicas": 1, "configSummary": "q40-s12x2"}
    assert status["configs"] == [{"fastPod": "resnet-q40-s12", "config": "q40-s12", "quotaRequest": "0.4",
                                  "quotaLimit": "0.4", "smPartition": 12, "replicas": 2, "readyReplicas": 1}]
    ready = status["conditions"][0]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "False", "ReplicasUnavailable")
    assert ready["message"].startswith("1 of 2 replicas ready")

    obj["status"] = status
    child["status"]["readyReplicas"] = 2
    later = compute_status(obj, parse_function(obj), [child], "T1")
    assert (later["conditions"][0]["status"], later["conditions"][0]["lastTransitionTime"]) == ("True", "T1")
    assert later["conditions"][1] == {**status["conditions"][1], "lastTransitionTime": "T0"}  # InvalidSpec unchanged


def test_an_invalid_spec_keeps_counting_what_runs() -> None:
    good = fastfunc()
    child = existing(only_child(good), replicas=2, readyReplicas=2)
    bad = fastfunc(fixed={"quotaRequest": "0.4", "smPartition": 0})
    with pytest.raises(InvalidFunction) as caught:
        parse_function(bad)
    status = compute_status(bad, caught.value, [child], "T0")
    conditions = {c["type"]: c for c in status["conditions"]}
    assert (conditions["InvalidSpec"]["status"], conditions["InvalidSpec"]["reason"]) == ("True", "InvalidShare")
    assert conditions["InvalidSpec"]["message"].startswith('spec.fixed.smPartition: "0" is out of range')
    assert conditions["Ready"]["status"] == "False"
    assert status["readyReplicas"] == 2


# --- the Unschedulable condition ---------------------------------------------------------------
SCHEDULER_SAYS = "0/1 nodes are available: 1 Insufficient fastgshare.caps.in.tum/vgpu."


def pod(name: str, phase: str = "Pending", scheduled: dict[str, Any] | None = None, **metadata: Any) -> dict[str, Any]:
    """A pod as the API gives it; ``scheduled`` is its PodScheduled condition, if any."""
    conditions = [{"type": "PodScheduled", **scheduled}] if scheduled is not None else []
    return {"metadata": {"name": name, "namespace": "fn", **metadata},
            "status": {"phase": phase, "conditions": conditions}}


STUCK = {"status": "False", "reason": "Unschedulable", "message": SCHEDULER_SAYS}


def test_no_pods_are_not_unschedulable() -> None:
    assert unschedulable([]) == {"type": "Unschedulable", "status": "False", "reason": "PodsSchedulable"}


def test_a_pending_pod_the_scheduler_has_not_refused_is_not_unschedulable() -> None:
    pods = [pod("a"), pod("b", scheduled={"status": "True"}), pod("c", phase="Running", scheduled={"status": "True"})]
    assert [pod_summary(p).unschedulable for p in pods] == [False, False, False]
    assert unschedulable([pod_summary(p) for p in pods])["status"] == "False"


def test_an_unschedulable_pod_says_so_with_the_schedulers_message() -> None:
    summary = pod_summary(pod("resnet-q40-s12-x7k2p", scheduled=STUCK))
    assert (summary.unschedulable, summary.message) == (True, SCHEDULER_SAYS)
    assert unschedulable([summary]) == {
        "type": "Unschedulable", "status": "True", "reason": "PodsUnschedulable",
        "message": f"1 pod of the function cannot be scheduled; pod resnet-q40-s12-x7k2p: {SCHEDULER_SAYS}"}


def test_mixed_pods_count_the_unschedulable_ones_and_name_the_first() -> None:
    pods = [pod("r-q40-s12-b", scheduled=STUCK), pod("r-q40-s12-c", phase="Running", scheduled={"status": "True"}),
            pod("r-q40-s12-a", scheduled={**STUCK, "message": "0/1 nodes are available: 1 node(s) didn't match "
                                                              "Pod's node affinity."}),
            pod("r-q40-s12-d")]
    condition = unschedulable([pod_summary(p) for p in pods])
    assert (condition["status"], condition["reason"]) == ("True", "PodsUnschedulable")
    assert condition["message"] == ("2 of 4 pods of the function cannot be scheduled; pod r-q40-s12-a: 0/1 nodes are "
                                    "available: 1 node(s) didn't match Pod's node affinity.")


def test_a_terminating_or_other_reason_pod_is_not_unschedulable() -> None:
    going = pod("a", scheduled=STUCK, deletionTimestamp="2026-01-01T00:00:00Z")
    gated = pod("b", scheduled={"status": "False", "reason": "SchedulerError", "message": "boom"})
    assert not any(pod_summary(p).unschedulable for p in (going, gated))


def test_status_carries_the_unschedulable_condition_and_its_transition_time() -> None:
    obj = fastfunc()
    spec = parse_function(obj)
    status = compute_status(obj, spec, [], "T0")
    [condition] = [c for c in status["conditions"] if c["type"] == "Unschedulable"]
    assert (condition["status"], condition["lastTransitionTime"]) == ("False", "T0")
    obj["status"] = status
    later = compute_status(obj, spec, [], "T1", pods=[pod_summary(pod("p", scheduled=STUCK))])
    [condition] = [c for c in later["conditions"] if c["type"] == "Unschedulable"]
    assert (condition["status"], condition["lastTransitionTime"]) == ("True", "T1")


def test_a_raised_child_gets_the_new_time_quota_in_place_and_keeps_its_name_and_selector() -> None:
    child = existing(only_child(fastfunc()))  # resnet-q40-s12, 2 replicas
    spec = parse_function(fastfunc(fixed={"quotaRequest": "0.6", "smPartition": 12, "replicas": 2}))
    assert isinstance(plan(spec, [child], None)[0], DeleteFaSTPod)  # not raised: replaced
    actions = plan(spec, [child], existing(desired_service(spec)), raised={"q60-s12": "resnet-q40-s12"})
    [patch] = actions
    assert isinstance(patch, PatchFaSTPod)
    assert patch.name == "resnet-q40-s12"
    assert patch.operations[1:] == (
        {"op": "add", "path": "/metadata/annotations/fastgshare~1gpu_quota_limit", "value": "0.6"},
        {"op": "add", "path": "/metadata/annotations/fastgshare~1gpu_quota_request", "value": "0.6"})


def test_a_child_is_matched_by_the_share_it_runs_and_a_held_name_gets_a_suffix() -> None:
    raised = existing(only_child(fastfunc()), uid="uid-raised")  # named q40-s12, runs q60-s12 since a raise
    raised["metadata"]["annotations"].update({keys.GPU_QUOTA_REQUEST: "0.6", keys.GPU_QUOTA_LIMIT: "0.6"})
    wanted = [{"quotaRequest": "0.6", "smPartition": 12, "replicas": 2},
              {"quotaRequest": "0.4", "smPartition": 12, "replicas": 1}]
    spec = parse_function(fastfunc(fixed=wanted[0]))
    assert plan(spec, [raised], existing(desired_service(spec))) == []  # it runs what is wanted: nothing to do
    both = attrs.evolve(spec, configs=(*spec.configs, *parse_function(fastfunc(fixed=wanted[1])).configs))
    [create] = plan(both, [raised], existing(desired_service(spec)))
    assert isinstance(create, CreateFaSTPod)
    assert create.body["metadata"]["name"] == "resnet-q40-s12-2"
    assert create.body["metadata"]["labels"][keys.FUNCTION_CONFIG_LABEL] == "q40-s12-2"
    assert create.body["spec"]["selector"]["matchLabels"][keys.FUNCTION_CONFIG_LABEL] == "q40-s12-2"
