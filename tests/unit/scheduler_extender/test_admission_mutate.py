"""Issue 36 item 6: pods find our scheduler. The mutating webhook sets ``schedulerName`` on a pod
that asks for the vGPU resource with the default scheduler, warns (changing nothing) when it names
another, and leaves every other pod alone; the validating webhook lets the warned pod in."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest

from fastgshare import keys
from fastgshare.scheduler_routing import DEFAULT_SCHEDULER, Route, route
from scheduler_extender.admission import ReviewError, mutate, review
from scheduler_extender.http.webhook import create_webhook_app

SHARE = {keys.GPU_QUOTA_REQUEST: "0.4", keys.GPU_QUOTA_LIMIT: "0.8", keys.GPU_SM_PARTITION: "50",
         keys.GPU_MEM: "1Gi"}
VGPU = {keys.VGPU_RESOURCE: "1"}


def pod(*, scheduler: str | None = None, section: str = "containers", kind: str = "limits",
        resources: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod whose ``section`` container asks for ``resources`` (the vGPU by default) under ``kind``."""
    container = {"name": "gpu", "image": "i", "resources": {kind: VGPU if resources is None else resources}}
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "i"}]}
    if section == "containers":
        spec["containers"] = [spec["containers"][0], container]
    else:
        spec[section] = [container]
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "team-a", "annotations": dict(SHARE if annotations is None
                                                                                 else annotations)},
            "spec": spec}


def review_of(obj: dict[str, Any], operation: str = "CREATE", version: str = "admission.k8s.io/v1",
              kind: str = "Pod") -> dict[str, Any]:
    return {"apiVersion": version, "kind": "AdmissionReview",
            "request": {"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": kind},
                        "operation": operation, "namespace": "team-a", "name": "p", "object": obj}}


def apply_patch(document: dict[str, Any], patch: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 ``add``/``replace`` on object members: all a scheduler patch may use; anything else fails."""
    result = copy.deepcopy(document)
    for operation in patch:
        assert operation["op"] in ("add", "replace"), operation
        *parents, last = [part.replace("~1", "/").replace("~0", "~") for part in operation["path"].split("/")[1:]]
        target = result
        for part in parents:
            target = target[part]  # the parent must exist (RFC 6902 section 4.1)
        assert isinstance(target, dict)
        if operation["op"] == "replace":
            assert last in target, operation
        target[last] = operation["value"]
    return result


def decoded_patch(response: dict[str, Any]) -> list[dict[str, Any]]:
    assert response["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(response["patch"], validate=True))
    assert isinstance(patch, list)
    return patch


# --- the decision --------------------------------------------------------------------------------

@pytest.mark.parametrize(("section", "kind"), [("containers", "limits"), ("containers", "requests"),
                                               ("initContainers", "limits"), ("initContainers", "requests")])
@pytest.mark.parametrize("scheduler", [None, "", DEFAULT_SCHEDULER])
def test_a_vgpu_pod_with_the_default_scheduler_is_routed_to_ours(section: str, kind: str,
                                                                 scheduler: str | None) -> None:
    decision = route(pod(scheduler=scheduler, section=section, kind=kind)["spec"])
    assert decision.route is Route.SET
    assert decision.warning == ""
    assert keys.SCHEDULER_NAME in decision.note


def test_a_vgpu_pod_naming_another_scheduler_is_warned_about_and_one_naming_ours_is_left() -> None:
    decision = route(pod(scheduler="volcano")["spec"])
    assert decision.route is Route.WARN
    assert "'volcano'" in decision.warning
    assert keys.VGPU_RESOURCE in decision.warning
    assert keys.SCHEDULER_NAME in decision.warning
    assert decision.note == ""
    assert route(pod(scheduler=keys.SCHEDULER_NAME)["spec"]).route is Route.OURS
    long_name = route(pod(scheduler="s" * 300)["spec"]).warning
    assert "s" * 64 not in long_name
    assert "..." in long_name
    assert len(long_name) <= 256  # the API server may truncate longer warnings


@pytest.mark.parametrize("spec", [
    pod(resources={"nvidia.com/gpu": "1"})["spec"],
    pod(resources={})["spec"],
    {"containers": [{"name": "c", "image": "i"}]},
    {"containers": "not a list", "initContainers": [None, {"resources": "x"}, {"resources": {"limits": []}}]},
    {},
], ids=["other-resource", "empty-resources", "no-resources", "malformed", "empty-spec"])
def test_a_pod_without_the_vgpu_resource_is_never_routed(spec: dict[str, Any]) -> None:
    assert route(spec).route is Route.UNTOUCHED
    assert route({**spec, "schedulerName": "volcano"}).route is Route.UNTOUCHED


# --- the mutating review -----------------------------------------------------------------------

@pytest.mark.parametrize("scheduler", [None, DEFAULT_SCHEDULER])
@pytest.mark.parametrize("version", ["admission.k8s.io/v1", "admission.k8s.io/v1beta1"])
def test_the_patch_sets_our_scheduler_and_nothing_else(scheduler: str | None, version: str) -> None:
    created = pod(scheduler=scheduler, section="initContainers")
    answer = mutate(review_of(created, version=version))
    assert answer["apiVersion"] == version
    assert answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == "u-1"
    assert response["allowed"] is True
    assert "warnings" not in response
    patched = apply_patch(created, decoded_patch(response))
    assert patched["spec"]["schedulerName"] == keys.SCHEDULER_NAME
    assert {**patched, "spec": {k: v for k, v in patched["spec"].items() if k != "schedulerName"}} == \
        {**created, "spec": {k: v for k, v in created["spec"].items() if k != "schedulerName"}}


def test_another_scheduler_is_kept_with_a_warning() -> None:
    response = mutate(review_of(pod(scheduler="volcano")))["response"]
    assert response == {"uid": "u-1", "allowed": True, "warnings": [route(pod(scheduler="volcano")["spec"]).warning]}


@pytest.mark.parametrize(("obj", "operation", "kind"), [
    pytest.param(pod(scheduler=keys.SCHEDULER_NAME), "CREATE", "Pod", id="ours-already"),
    pytest.param(pod(resources={"nvidia.com/gpu": "1"}), "CREATE", "Pod", id="no-vgpu"),
    pytest.param(pod(), "UPDATE", "Pod", id="update"),  # schedulerName cannot change after create
    pytest.param(pod(), "CREATE", "Node", id="not-a-pod"),
    pytest.param({"kind": "Pod", "spec": "x"}, "CREATE", "Pod", id="malformed-spec"),
])
def test_everything_else_is_allowed_unchanged(obj: dict[str, Any], operation: str, kind: str) -> None:
    assert mutate(review_of(obj, operation, kind=kind))["response"] == {"uid": "u-1", "allowed": True}


def test_a_body_that_is_no_review_is_an_error_for_mutate_too() -> None:
    with pytest.raises(ReviewError, match=r"request\.uid is required"):
        mutate({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {}})


# --- the validating webhook after it -----------------------------------------------------------

def test_the_validating_webhook_admits_a_warned_pod_and_still_refuses_the_default_scheduler() -> None:
    assert review(review_of(pod(scheduler="volcano")))["response"]["allowed"] is True
    # the mutating webhook runs first; a default-scheduler vGPU pod here means it did not
    refused = review(review_of(pod(scheduler=DEFAULT_SCHEDULER)))["response"]
    assert refused["allowed"] is False
    assert "spec.schedulerName" in refused["status"]["message"]
    # another scheduler does not excuse the share's own problems
    bad = review(review_of(pod(scheduler="volcano", annotations={**SHARE, keys.GPU_SM_PARTITION: "0"})))
    assert bad["response"]["allowed"] is False
    assert "schedulerName" not in bad["response"]["status"]["message"]
    # a pod with a share but no vGPU request is not routed, so its scheduler is still a problem
    unrouted = review(review_of(pod(scheduler="volcano", resources={})))["response"]
    assert unrouted["allowed"] is False
    assert "spec.schedulerName" in unrouted["status"]["message"]


# --- the HTTP edge -----------------------------------------------------------------------------

def test_post_mutate_answers_with_a_patch_that_applies() -> None:
    client = create_webhook_app().test_client()
    created = pod()
    answer = client.post("/mutate", json=review_of(created))
    assert answer.status_code == 200
    body = answer.get_json()
    assert body["response"]["allowed"] is True
    assert apply_patch(created, decoded_patch(body["response"]))["spec"]["schedulerName"] == keys.SCHEDULER_NAME
    warned = client.post("/mutate", json=review_of(pod(scheduler="volcano"))).get_json()["response"]
    assert warned["warnings"]
    assert "patch" not in warned
    assert client.post("/mutate", json=[]).status_code == 400
    assert client.post("/mutate", data="{", content_type="application/json").status_code == 400
    assert client.post("/mutate", data="x", content_type="text/plain").status_code == 415
