"""The admission webhook: invalid shares refused at apply time, with the messages of ``fastgshare check``."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from fastgshare import keys
from fastgshare_cli.check import check_file
from scheduler_extender.admission import MAX_MESSAGE, ReviewError, review
from scheduler_extender.http.webhook import create_webhook_app

SHARE = {"fastgshare/gpu_quota_request": "0.4", "fastgshare/gpu_quota_limit": "0.8",
         "fastgshare/gpu_sm_partition": "50", "fastgshare/gpu_mem": "1Gi"}
FASTPOD: dict[str, Any] = {
    "apiVersion": keys.FASTPOD_API_VERSION, "kind": "FaSTPod",
    "metadata": {"name": "resnet", "namespace": "team-a", "annotations": dict(SHARE)},
    "spec": {"replicas": 2, "podSpec": {"containers": [{"name": "c", "image": "i"}]}},
}
POD: dict[str, Any] = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "p", "namespace": "team-a", "annotations": dict(SHARE)},
    "spec": {"schedulerName": keys.SCHEDULER_NAME,
             "containers": [{"name": "c", "image": "i", "resources": {"limits": {keys.VGPU_RESOURCE: "1"}}}]},
}


def admission_review(obj: dict[str, Any], operation: str = "CREATE", version: str = "admission.k8s.io/v1",
                     ) -> dict[str, Any]:
    group = "fastgshare.caps.in.tum" if obj["kind"] == "FaSTPod" else ""
    return {"apiVersion": version, "kind": "AdmissionReview",
            "request": {"uid": "7b1f", "kind": {"group": group, "version": "v1", "kind": obj["kind"]},
                        "operation": operation, "namespace": "team-a", "name": obj["metadata"].get("name", ""),
                        "object": obj}}


def with_annotations(obj: dict[str, Any], **changes: str | None) -> dict[str, Any]:
    result = copy.deepcopy(obj)
    annotations = result["metadata"]["annotations"]
    for key, value in changes.items():
        name = f"fastgshare/{key}"
        if value is None:
            annotations.pop(name, None)
        else:
            annotations[name] = value
    return result


def check_messages(tmp_path: Path, obj: dict[str, Any]) -> list[str]:
    """What ``fastgshare check`` says of the same object."""
    path = tmp_path / "object.yaml"
    path.write_text(yaml.safe_dump(obj))
    return [problem for checked in check_file(str(path)) for problem in checked.problems]


@pytest.mark.parametrize("obj", [FASTPOD, POD], ids=["fastpod", "pod"])
def test_a_valid_object_is_allowed(obj: dict[str, Any]) -> None:
    answer = review(admission_review(obj))
    assert answer == {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                      "response": {"uid": "7b1f", "allowed": True}}


BAD = [
    pytest.param(with_annotations(FASTPOD, gpu_sm_partition="150"), id="fastpod-sm-out-of-range"),
    pytest.param(with_annotations(FASTPOD, gpu_quota_request=None, gpu_quota_requests="0.4"), id="fastpod-typo"),
    pytest.param(with_annotations(FASTPOD, gpu_quota_limit="-0.1"), id="fastpod-negative"),
    pytest.param({**FASTPOD, "spec": {"replicas": 1}}, id="fastpod-without-podspec"),
    pytest.param(with_annotations(POD, gpu_mem="18446744073709551616"), id="pod-memory-over-u64"),
    pytest.param({**POD, "spec": {"containers": [{"name": "c", "image": "i"}]}}, id="pod-share-nothing-reads"),
]


@pytest.mark.parametrize("obj", BAD)
def test_an_invalid_object_is_denied_with_the_messages_of_check(obj: dict[str, Any], tmp_path: Path) -> None:
    answer = review(admission_review(obj))
    response = answer["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    expected = check_messages(tmp_path, obj)
    assert expected, "check must find the same object invalid"
    name = obj["metadata"]["name"]
    assert response["status"]["message"] == f"fastgshare: {obj['kind']}/{name}: " + "; ".join(expected)


def test_fastpod_updates_are_judged_pod_updates_and_other_kinds_are_not() -> None:
    bad_fastpod = with_annotations(FASTPOD, gpu_sm_partition="0")
    assert review(admission_review(bad_fastpod, "UPDATE"))["response"]["allowed"] is False
    bad_pod = with_annotations(POD, gpu_sm_partition="0")
    assert review(admission_review(bad_pod, "UPDATE"))["response"]["allowed"] is True  # the extender patches pods
    assert review(admission_review(bad_pod, "DELETE"))["response"]["allowed"] is True
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "annotations": {
        "fastgshare/gpu_sm_partition": "0"}}}
    assert review(admission_review(config_map))["response"]["allowed"] is True


def test_a_pod_without_a_share_or_vgpu_is_allowed() -> None:
    plain = {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "web-"},
             "spec": {"containers": [{"name": "c", "image": "i"}]}}
    assert review(admission_review(plain))["response"]["allowed"] is True


def test_v1beta1_reviews_are_answered_in_v1beta1_and_generated_names_are_shown() -> None:
    pod = with_annotations(POD, gpu_sm_partition="abc")
    pod["metadata"] = {"generateName": "resnet-", "annotations": pod["metadata"]["annotations"]}
    answer = review(admission_review(pod, version="admission.k8s.io/v1beta1"))
    assert answer["apiVersion"] == "admission.k8s.io/v1beta1"
    assert answer["response"]["status"]["message"].startswith("fastgshare: Pod/resnet-*: fastgshare/gpu_sm_partition")


def test_a_hostile_object_gets_a_bounded_answer() -> None:
    pod = with_annotations(POD, gpu_sm_partition="9" * 10_000, gpu_mem="x" * 10_000, gpu_quota_limit="1e308")
    for index in range(200):
        pod["metadata"]["annotations"][f"fastgshare/unknown_{index}"] = "1"
    message = review(admission_review(pod))["response"]["status"]["message"]
    assert len(message) <= MAX_MESSAGE
    assert message.endswith("...")


@pytest.mark.parametrize(("body", "message"), [
    ([], 'expected an AdmissionReview object ("kind": "AdmissionReview")'),
    ({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v2"},
     "apiVersion 'admission.k8s.io/v2' is not supported; allowed: admission.k8s.io/v1, admission.k8s.io/v1beta1"),
    ({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {}}, "request.uid is required"),
])
def test_a_body_that_is_no_review_is_an_error(body: object, message: str) -> None:
    with pytest.raises(ReviewError) as caught:
        review(body)
    assert str(caught.value) == message


def test_the_http_edge_answers_reviews_and_400_for_the_rest() -> None:
    client = create_webhook_app().test_client()
    answer = client.post("/validate", json=admission_review(with_annotations(FASTPOD, gpu_sm_partition="0")))
    assert answer.status_code == 200
    assert answer.json is not None
    assert answer.json["response"]["allowed"] is False
    assert client.post("/validate", json=[]).status_code == 400
    assert client.post("/validate", data="{", content_type="application/json").status_code == 400
    assert client.post("/validate", data="x", content_type="text/plain").status_code == 415
    assert client.get("/healthz").json == {"status": "ok"}
