"""Workload lists and Kubernetes manifests turned into shares."""

from __future__ import annotations

import re

import pytest

from fastgshare import keys
from fastgshare.errors import InvalidWorkload
from fastgshare.workload import manifest_shares, parse_workload_list
from tests.builders import share_annotations


def _fastpod(annotations: dict[str, str], replicas: object = 2) -> dict[str, object]:
    return {"apiVersion": keys.FASTPOD_API_VERSION, "kind": "FaSTPod",
            "metadata": {"name": "resnet", "annotations": annotations},
            "spec": {"replicas": replicas, "podSpec": {"containers": [{"name": "c", "image": "i"}]}}}


def _pod(annotations: dict[str, str] | None = None, vgpu: bool = True) -> dict[str, object]:
    resources = {"limits": {keys.VGPU_RESOURCE: 1}} if vgpu else {}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "annotations": annotations or {}},
            "spec": {"containers": [{"name": "c", "image": "i", "resources": resources}]}}


def test_workload_list_parses() -> None:
    items = parse_workload_list([{"name": "a", "count": 3, "annotations": share_annotations()},
                                 {"name": "b", "annotations": share_annotations(sm="10")}])
    assert [(i.name, i.count, i.share.sm_percent) for i in items] == [("a", 3, 50), ("b", 1, 10)]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param([], "must be a non-empty list", id="empty"),
        pytest.param({"name": "a"}, "must be a non-empty list", id="mapping"),
        pytest.param(["x"], "entry 0: must be a mapping", id="entry-not-mapping"),
        pytest.param([{"count": 1}], "entry 0: 'name' must be a non-empty string", id="no-name"),
        pytest.param([{"name": "a", "count": 0, "annotations": {}}], "entry 0 (a): 'count' must be an integer >= 1",
                     id="zero-count"),
        pytest.param([{"name": "a", "count": True, "annotations": {}}], "'count' must be an integer", id="bool-count"),
        pytest.param([{"name": "a"}], "entry 0 (a): 'annotations' must be a mapping", id="no-annotations"),
        pytest.param([{"name": "a", "annotations": share_annotations(sm="0")}],
                     "entry 0 (a): invalid GPU share: fastgshare/gpu_sm_partition", id="bad-share"),
    ],
)
def test_bad_workload_lists_are_explained(data: object, message: str) -> None:
    with pytest.raises(InvalidWorkload) as caught:
        parse_workload_list(data)
    assert message in str(caught.value)


def test_every_bad_entry_is_reported() -> None:
    with pytest.raises(InvalidWorkload) as caught:
        parse_workload_list([{"name": "a"}, {"name": "b", "count": -1, "annotations": {}}])
    assert "entry 0 (a)" in str(caught.value)
    assert "entry 1 (b)" in str(caught.value)


def test_fastpod_share_and_replicas() -> None:
    [found] = manifest_shares(_fastpod(share_annotations(), replicas=3))
    assert (found.kind, found.name, found.replicas, found.error) == ("FaSTPod", "resnet", 3, None)
    assert found.share is not None
    assert found.share.request_permille == 400


def test_fastpod_without_share_is_an_error_not_a_skip() -> None:
    [found] = manifest_shares(_fastpod({}))
    assert found.share is None
    assert found.error is not None
    assert {p.field for p in found.error.problems} == {keys.GPU_QUOTA_REQUEST, keys.GPU_QUOTA_LIMIT, keys.GPU_MEM}


def test_fastpod_replicas_default_to_one_and_must_be_integers() -> None:
    document = _fastpod(share_annotations())
    del document["spec"]["replicas"]  # type: ignore[attr-defined]
    assert manifest_shares(document)[0].replicas == 1
    with pytest.raises(InvalidWorkload, match=re.escape("spec.replicas must be an integer >= 0, got '2'")):
        manifest_shares(_fastpod(share_annotations(), replicas="2"))


def test_pod_requesting_vgpu_needs_a_share() -> None:
    [found] = manifest_shares(_pod())
    assert found.error is not None


def test_plain_pod_is_skipped_with_a_reason() -> None:
    [found] = manifest_shares(_pod(vgpu=False))
    assert found.share is None
    assert found.error is None
    assert "no fastgshare/ share annotations" in found.skipped


def test_pod_with_annotations_but_no_resource_is_still_checked() -> None:
    [found] = manifest_shares(_pod(share_annotations(sm="500"), vgpu=False))
    assert found.error is not None


def test_deployment_reads_the_pod_template() -> None:
    pod = _pod(share_annotations())
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
                  "spec": {"replicas": 4, "template": {"metadata": pod["metadata"], "spec": pod["spec"]}}}
    [found] = manifest_shares(deployment)
    assert (found.kind, found.replicas, found.share is not None) == ("Deployment", 4, True)


def test_list_and_other_kinds() -> None:
    found = manifest_shares({"kind": "List", "items": [_pod(share_annotations()),
                                                       {"kind": "Service", "metadata": {"name": "s"}}]})
    assert [f.kind for f in found] == ["Pod", "Service"]
    assert found[1].skipped == "Service objects carry no GPU share"


@pytest.mark.parametrize(
    ("document", "message"),
    [("text", "expected a Kubernetes object (a mapping), got str"), ({"metadata": {}}, "object has no 'kind'"),
     ({"kind": "List", "items": 3}, "a List must have an 'items' list")],
)
def test_malformed_documents(document: object, message: str) -> None:
    with pytest.raises(InvalidWorkload, match=re.escape(message)):
        manifest_shares(document)
