"""A FaSTPod's time-only change updates its running pods in place; SM or memory changes roll them."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fastgshare import keys
from fastpod_crd_controller import names
from fastpod_crd_controller.errors import ApiError
from fastpod_crd_controller.plan import in_place_updates
from fastpod_crd_controller.pods import pod_info
from fastpod_crd_controller.spec import parse_fastpod
from tests.unit.fastpod_crd_controller.objects import NAMESPACE, fastpod, pod, with_annotations
from tests.unit.fastpod_crd_controller.test_reconcile import Fixture


def built_pod(name: str, owner: dict[str, Any], **options: Any) -> dict[str, Any]:
    """A pod as the controller builds it from ``owner``: its revision and its share annotations."""
    result = pod(name, owner, **options)
    annotations = result["metadata"].setdefault("annotations", {})
    annotations.update({k: v for k, v in owner["metadata"]["annotations"].items() if k in keys.SHARE_ANNOTATIONS})
    return result


@pytest.fixture
def f() -> Fixture:
    return Fixture()


def test_only_pods_that_differ_in_their_time_quota_are_updated_in_place() -> None:
    old = fastpod(replicas=3)
    new = with_annotations(old, fastgshare__gpu_quota_limit="0.5")
    sm_changed = with_annotations(old, fastgshare__gpu_sm_partition="30")
    pods = [pod_info(built_pod("a", old)), pod_info(built_pod("b", new)), pod_info(built_pod("c", sm_changed)),
            pod_info(built_pod("d", old, deleting=True))]
    assert [p.name for p in in_place_updates(pods, parse_fastpod(new))] == ["a"]


def test_a_time_quota_change_patches_the_running_pods_and_creates_or_deletes_nothing(f: Fixture) -> None:
    old = fastpod(replicas=2)
    changed = with_annotations(old, fastgshare__gpu_quota_request="0.3", fastgshare__gpu_quota_limit="0.5")
    f.given(changed, built_pod("web-a", old, node="n", ready=True), built_pod("web-b", old, node="n", ready=True))
    writes = f.sync()
    assert [w for w in writes if w[1] == "pods"] == [("patch", "pods", NAMESPACE, "web-a"),
                                                      ("patch", "pods", NAMESPACE, "web-b")]
    revision = parse_fastpod(changed).revision
    _, body = f.kube.pod_patches[0]
    assert body == {"metadata": {"uid": "uid-web-a", "labels": {keys.REVISION_LABEL: revision},
                                 "annotations": {keys.GPU_QUOTA_REQUEST: "0.3", keys.GPU_QUOTA_LIMIT: "0.5"}}}
    assert f.status()["updatedReplicas"] == 2
    event, = (e for e in f.kube.events if e["reason"] == names.REASON_UPDATED_IN_PLACE)
    assert "web-a, web-b" in event["message"]
    assert "request 0.3 limit 0.5" in event["message"]


def test_once_the_cache_shows_the_patch_nothing_more_is_written(f: Fixture) -> None:
    old = fastpod(replicas=1)
    changed = with_annotations(old, fastgshare__gpu_quota_limit="0.5")
    running = built_pod("web-a", old, node="n", ready=True)
    f.given(changed, running)
    f.sync()
    patched = copy.deepcopy(running)
    patched["metadata"]["labels"][keys.REVISION_LABEL] = parse_fastpod(changed).revision
    patched["metadata"]["annotations"][keys.GPU_QUOTA_LIMIT] = "0.5"
    f.given(patched)
    assert [w for w in f.sync() if w[1] == "pods"] == []


@pytest.mark.parametrize("change", [{"fastgshare__gpu_sm_partition": "30"}, {"fastgshare__gpu_mem": "2Gi"},
                                    {"fastgshare__gpu_quota_limit": "0.5", "fastgshare__gpu_sm_partition": "30"}])
def test_sm_or_memory_changes_still_roll_the_pods(f: Fixture, change: dict[str, str]) -> None:
    old = fastpod(replicas=1)
    f.given(with_annotations(old, **change), built_pod("web-a", old, node="n", ready=True))
    assert [w[0] for w in f.sync() if w[1] == "pods"] == ["delete", "create"]
    assert f.kube.pod_patches == []


def test_a_failed_patch_is_reported_and_retried(f: Fixture) -> None:
    old = fastpod(replicas=1)
    f.given(with_annotations(old, fastgshare__gpu_quota_limit="0.5"), built_pod("web-a", old, node="n", ready=True))
    f.kube.fail("patch/pods", ApiError(500, "InternalError", "etcd is down"))
    with pytest.raises(ApiError):
        f.sync()
    assert any(e["reason"] == names.REASON_FAILED_UPDATE and "etcd is down" in e["message"] for e in f.kube.events)
    assert f.kube.created == []


def test_a_pod_replaced_meanwhile_is_skipped(f: Fixture) -> None:
    old = fastpod(replicas=1)
    f.given(with_annotations(old, fastgshare__gpu_quota_limit="0.5"), built_pod("web-a", old, node="n", ready=True))
    f.kube.fail("patch/pods", ApiError(409, "Conflict", "Precondition failed: UID"))
    f.sync()
    assert f.kube.created == []  # the outdated pod is left for the next reconcile, not rolled
