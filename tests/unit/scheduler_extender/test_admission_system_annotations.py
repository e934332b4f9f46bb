"""The admission webhook keeps the annotations fastgshare's components write for each other to them.

``fastgshare/assignment`` (and its signature, ``fastgshare/allocated``, the node inventory) are set,
changed or removed only by the extender's and the node agent's service accounts (``--system-writers``);
anyone else, cluster admins included, is refused with one line naming the annotation, the user and
who may write it (issue 37 item 2, DESIGN.md §8).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from flask import Flask

from fastgshare import keys
from scheduler_extender.admission import review
from scheduler_extender.config import DEFAULT_SYSTEM_WRITERS, ConfigError, ExtenderConfig, parse_system_writers
from scheduler_extender.http.webhook import create_webhook_app
from scheduler_extender.main import build_parser

ADMIN = "admin"
EXTENDER = f"system:serviceaccount:{keys.SYSTEM_NAMESPACE}:{keys.SCHEDULER_SERVICE_ACCOUNT}"
NODE_AGENT = f"system:serviceaccount:{keys.SYSTEM_NAMESPACE}:{keys.NODE_AGENT_SERVICE_ACCOUNT}"
WRITERS = f"{EXTENDER}, {NODE_AGENT}"
SHARE = {keys.GPU_QUOTA_REQUEST: "0.4", keys.GPU_QUOTA_LIMIT: "0.8", keys.GPU_SM_PARTITION: "50", keys.GPU_MEM: "1Gi"}
ASSIGNMENT = '{"v":1,"gpu":"GPU-1","request":400}'
POD: dict[str, Any] = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "p", "namespace": "team-a", "labels": {"app": "x"}, "annotations": dict(SHARE)},
    "spec": {"schedulerName": keys.SCHEDULER_NAME,
             "containers": [{"name": "c", "image": "i", "resources": {"limits": {keys.VGPU_RESOURCE: "1"}}}]},
}
NODE: dict[str, Any] = {"apiVersion": "v1", "kind": "Node",
                        "metadata": {"name": "gpu-1", "annotations": {keys.NODE_GPU_INFO_ANNOTATION: '{"v":1}'}}}


def annotated(obj: dict[str, Any], **changes: str | None) -> dict[str, Any]:
    """``obj`` with annotations set (a value) or removed (None); keys are given without ``fastgshare/``."""
    result = copy.deepcopy(obj)
    annotations = result["metadata"]["annotations"]
    for key, value in changes.items():
        name = keys.ANNOTATION_PREFIX + key
        if value is None:
            annotations.pop(name, None)
        else:
            annotations[name] = value
    return result


def request(obj: dict[str, Any], old: dict[str, Any] | None = None, *, user: str = ADMIN,
            operation: str | None = None, version: str = "admission.k8s.io/v1") -> dict[str, Any]:
    body: dict[str, Any] = {
        "uid": "u-1", "kind": {"group": "", "version": "v1", "kind": obj["kind"]},
        "operation": operation or ("UPDATE" if old is not None else "CREATE"),
        "name": obj["metadata"]["name"], "object": obj, "userInfo": {"username": user, "groups": ["system:masters"]}}
    if obj["kind"] == "Pod":
        body["namespace"] = "team-a"
    if old is not None:
        body["oldObject"] = old
    return {"apiVersion": version, "kind": "AdmissionReview", "request": body}


def response(body: dict[str, Any]) -> dict[str, Any]:
    answer: dict[str, Any] = review(body)["response"]
    return answer


def denial(body: dict[str, Any]) -> str:
    answer = response(body)
    assert answer["allowed"] is False, answer
    assert answer["status"]["code"] == 403
    message: str = answer["status"]["message"]
    assert "\n" not in message
    return message


ASSIGNED = annotated(POD, assignment=ASSIGNMENT)


def test_an_admin_creating_a_pod_with_an_assignment_is_refused_naming_annotation_user_and_writers() -> None:
    assert denial(request(ASSIGNED)) == (
        f'fastgshare: Pod/p: user "admin" may not set {keys.POD_ASSIGNMENT_ANNOTATION}: only {WRITERS} '
        "write fastgshare's system annotations")


def test_an_admin_annotating_a_running_pod_with_an_assignment_is_refused() -> None:
    message = denial(request(ASSIGNED, POD))
    assert f'user "admin" may not set {keys.POD_ASSIGNMENT_ANNOTATION}' in message


@pytest.mark.parametrize("user", [EXTENDER, NODE_AGENT])
def test_the_extender_and_the_node_agent_may_write_them(user: str) -> None:
    allocated = annotated(ASSIGNED, allocated="2024-01-01T00:00:00Z", **{"assignment-signature": "abc"})
    assert response(request(allocated, POD, user=user))["allowed"] is True
    assert response(request(annotated(ASSIGNED, assignment="{}"), ASSIGNED, user=user))["allowed"] is True
    assert response(request(POD, ASSIGNED, user=user))["allowed"] is True


@pytest.mark.parametrize(("new", "old", "verb", "annotation"), [
    pytest.param(annotated(ASSIGNED, assignment='{"v":1,"gpu":"GPU-1","request":1000}'), ASSIGNED, "change",
                 keys.POD_ASSIGNMENT_ANNOTATION, id="changed"),
    pytest.param(POD, ASSIGNED, "remove", keys.POD_ASSIGNMENT_ANNOTATION, id="removed"),
    pytest.param(annotated(ASSIGNED, allocated="now"), ASSIGNED, "set", keys.POD_ALLOCATED_ANNOTATION,
                 id="allocated"),
    pytest.param(annotated(ASSIGNED, **{"assignment-signature": "forged"}), ASSIGNED, "set",
                 keys.POD_ASSIGNMENT_SIGNATURE_ANNOTATION, id="signature"),
])
def test_any_change_or_removal_by_others_is_refused(new: dict[str, Any], old: dict[str, Any], verb: str,
                                                    annotation: str) -> None:
    assert f'user "admin" may not {verb} {annotation}: only {WRITERS}' in denial(request(new, old))


def test_several_annotations_are_named_in_one_line() -> None:
    forged = annotated(POD, assignment=ASSIGNMENT, allocated="now")
    assert (f'may not set {keys.POD_ASSIGNMENT_ANNOTATION}, set {keys.POD_ALLOCATED_ANNOTATION}: only'
            in denial(request(forged)))


def test_a_user_editing_labels_or_shares_of_an_assigned_pod_is_allowed() -> None:
    relabelled = copy.deepcopy(ASSIGNED)
    relabelled["metadata"]["labels"]["app"] = "y"
    assert response(request(relabelled, ASSIGNED, user="alice"))["allowed"] is True
    reshared = annotated(ASSIGNED, gpu_quota_request="0.2", gpu_quota_limit="0.3")
    assert response(request(reshared, ASSIGNED, user="alice"))["allowed"] is True


def test_an_invalid_share_edit_on_update_is_refused_as_on_create_and_old_problems_are_not_held_against_it() -> None:
    bad = annotated(ASSIGNED, gpu_quota_limit="0.1")  # below the request
    message = denial(request(bad, ASSIGNED, user="alice"))
    assert message == (f'fastgshare: Pod/p: {keys.GPU_QUOTA_REQUEST}: request "0.4" is greater than '
                       f'{keys.GPU_QUOTA_LIMIT} "0.1"; allowed: request <= limit')
    # A pod admitted with a problem while the webhook was down may still be relabelled and patched.
    already_bad = annotated(bad, gpu_sm_partition="0")
    relabelled = copy.deepcopy(already_bad)
    relabelled["metadata"]["labels"]["app"] = "y"
    assert response(request(relabelled, already_bad, user="alice"))["allowed"] is True
    assert response(request(annotated(already_bad, allocated="now"), already_bad, user=NODE_AGENT))["allowed"] is True


def test_pod_without_annotations_and_deletes_are_allowed() -> None:
    plain = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"},
             "spec": {"containers": [{"name": "c", "image": "i"}]}}
    assert response(request(plain, plain, user="alice"))["allowed"] is True
    assert response(request(POD, ASSIGNED, operation="DELETE"))["allowed"] is True


def test_an_update_without_an_old_object_is_judged_as_if_the_annotations_were_new() -> None:
    body = request(ASSIGNED, operation="UPDATE")
    assert f"may not set {keys.POD_ASSIGNMENT_ANNOTATION}" in denial(body)


def test_a_node_inventory_forged_by_an_admin_is_refused_and_the_node_agents_is_allowed() -> None:
    forged = annotated(NODE, gpu_info='{"v":1,"gpus":[{"memory":1e15}]}')
    assert denial(request(forged, NODE)) == (
        f'fastgshare: Node/gpu-1: user "admin" may not change {keys.NODE_GPU_INFO_ANNOTATION}: only {WRITERS} '
        "write fastgshare's system annotations")
    assert f"may not set {keys.NODE_METRICS_PORT_ANNOTATION}:" in denial(request(annotated(NODE, metrics_port="1"),
                                                                                 NODE))
    assert f"may not set {keys.NODE_GPU_INFO_ANNOTATION}:" in denial(request(NODE))  # a node created with it
    assert f"may not remove {keys.NODE_GPU_INFO_ANNOTATION}" in denial(request(annotated(NODE, gpu_info=None), NODE))
    assert response(request(forged, NODE, user=NODE_AGENT))["allowed"] is True
    relabelled = copy.deepcopy(NODE)
    relabelled["metadata"]["labels"] = {"zone": "a"}
    assert response(request(relabelled, NODE, user="system:node:gpu-1"))["allowed"] is True


def test_v1beta1_reviews_are_judged_the_same_and_answered_in_v1beta1() -> None:
    answer = review(request(ASSIGNED, POD, version="admission.k8s.io/v1beta1"))
    assert answer["apiVersion"] == "admission.k8s.io/v1beta1"
    assert answer["response"]["allowed"] is False
    assert keys.POD_ASSIGNMENT_ANNOTATION in answer["response"]["status"]["message"]
    allowed = review(request(ASSIGNED, POD, user=EXTENDER, version="admission.k8s.io/v1beta1"))
    assert allowed["response"] == {"uid": "u-1", "allowed": True}


def test_a_request_without_a_user_is_refused_and_a_huge_name_is_bounded() -> None:
    body = request(ASSIGNED)
    del body["request"]["userInfo"]
    assert 'user "" may not set' in denial(body)
    assert len(denial(request(ASSIGNED, user="x" * 100_000))) < 1000


def test_the_writers_are_those_given() -> None:
    assert response(request(ASSIGNED, POD, user="bob"))["allowed"] is False
    body = request(ASSIGNED, POD, user="bob")
    assert review(body, system_writers=("bob",))["response"]["allowed"] is True
    assert 'only alice write' in review(body, system_writers=("alice",))["response"]["status"]["message"]


def test_the_http_edge_uses_the_writers_it_was_given() -> None:
    def allowed(app: Flask, body: dict[str, Any]) -> bool:
        answer = app.test_client().post("/validate", json=body).json
        assert answer is not None
        return bool(answer["response"]["allowed"])

    bob_writes = create_webhook_app(system_writers=("bob",))
    assert allowed(bob_writes, request(ASSIGNED, POD, user="bob"))
    assert not allowed(bob_writes, request(ASSIGNED, POD, user="admin"))
    assert allowed(create_webhook_app(), request(ASSIGNED, POD, user=EXTENDER))


def test_the_flag_defaults_to_our_two_service_accounts_and_names_itself_when_wrong() -> None:
    assert DEFAULT_SYSTEM_WRITERS == (EXTENDER, NODE_AGENT)
    assert ExtenderConfig().system_writers == DEFAULT_SYSTEM_WRITERS
    assert build_parser().parse_args([]).system_writers == ",".join(DEFAULT_SYSTEM_WRITERS)
    assert parse_system_writers(" a ,b,") == ("a", "b")
    for text in ("", " , ", "a b,c"):
        with pytest.raises(ConfigError, match=r"^--system-writers .* allowed: comma-separated user names"):
            parse_system_writers(text)


def test_a_node_update_whose_old_object_is_the_new_one_is_judged_against_the_stored_node() -> None:
    """kube-apiserver 1.20.2 sends node UPDATE reviews with oldObject == object."""
    forged = annotated(NODE, gpu_info='{"v":1,"forged":true}')
    stored = NODE
    asked: list[str] = []

    def read(name: str) -> dict[str, Any] | None:
        asked.append(name)
        return stored

    body = request(forged, forged)
    assert review(body)["response"]["allowed"] is True  # without a reader, oldObject is all there is
    answer = review(body, stored_node=read)["response"]
    assert f'user "admin" may not change {keys.NODE_GPU_INFO_ANNOTATION}' in answer["status"]["message"]
    assert asked == ["gpu-1"]
    assert review(request(NODE, NODE), stored_node=read)["response"]["allowed"] is True
    assert review(request(forged, forged), stored_node=lambda name: None)["response"]["allowed"] is True
    assert review(request(forged, forged, user=NODE_AGENT), stored_node=read)["response"]["allowed"]
    asked.clear()
    review(request(forged, NODE), stored_node=read)  # a true oldObject: no read
    assert asked == []


# --- the node agent changes nothing but our annotations (issue 37 item 6) ---------------------

def test_the_node_agent_may_mark_a_pod_allocated_and_publish_its_inventory() -> None:
    pod = annotated(POD, assignment=ASSIGNMENT)
    assert response(request(annotated(pod, allocated="1"), pod, user=NODE_AGENT))["allowed"]
    moved = copy.deepcopy(pod)
    moved["metadata"].update(resourceVersion="7", managedFields=[{"manager": "agent"}])
    moved["status"] = {"phase": "Running"}
    assert response(request(annotated(moved, allocated="1"), pod, user=NODE_AGENT))["allowed"]
    assert response(request(annotated(NODE, gpu_info='{"v":2}', metrics_port="9401"), NODE, user=NODE_AGENT))["allowed"]


@pytest.mark.parametrize(("what", "change"), [
    ("metadata.labels", lambda o: o["metadata"]["labels"].update(app="stolen")),
    ("metadata.annotations[fastgshare/gpu_quota_limit]",
     lambda o: o["metadata"]["annotations"].update({keys.GPU_QUOTA_LIMIT: "1.0"})),
    ("metadata.ownerReferences", lambda o: o["metadata"].update(ownerReferences=[{"kind": "X", "name": "y"}])),
    ("spec", lambda o: o["spec"].update(activeDeadlineSeconds=1)),
])
def test_the_node_agent_may_not_change_anything_else_of_a_pod(what: str, change: Any) -> None:
    changed = copy.deepcopy(POD)
    change(changed)
    message = denial(request(changed, POD, user=NODE_AGENT))
    assert f"it changed {what}" in message, message
    assert NODE_AGENT in message
    assert response(request(changed, POD, user=EXTENDER))["allowed"]  # the extender is not confined


def test_the_node_agent_may_not_taint_or_relabel_a_node_nor_create_one() -> None:
    tainted = copy.deepcopy(NODE)
    tainted["spec"] = {"taints": [{"key": "k", "effect": "NoSchedule"}]}
    assert "it changed spec" in denial(request(tainted, NODE, user=NODE_AGENT))
    relabelled = copy.deepcopy(NODE)
    relabelled["metadata"]["labels"] = {"gpu": "no"}
    assert "it changed metadata.labels" in denial(request(relabelled, NODE, user=NODE_AGENT))
    assert "may not create a Node" in denial(request(NODE, user=NODE_AGENT))
    assert "may not create a Pod" in denial(request(POD, user=NODE_AGENT))
