"""reconcile(key) in the sample-controller way: preload the caches, run once, assert the API calls."""

from __future__ import annotations

import copy
import itertools
import threading
from collections.abc import Mapping
from typing import Any

import pytest

from fastgshare import keys
from fastgshare.codec import PodAssignment, encode_assignment
from fastpod_crd_controller import names
from fastpod_crd_controller.builder import PodConfig, make_pod
from fastpod_crd_controller.controller import AcceptedSpecs, Controller
from fastpod_crd_controller.errors import ApiError
from fastpod_crd_controller.events import EventRecorder
from fastpod_crd_controller.spec import parse_fastpod
from tests.builders import make_share, share_annotations
from tests.unit.fastpod_crd_controller.fakes import FakeKube
from tests.unit.fastpod_crd_controller.objects import NAMESPACE, fastpod, pod, with_annotations

NOW = "2026-11-29T12:00:00Z"
KEY = f"{NAMESPACE}/web"


class Fixture:
    def __init__(self) -> None:
        self.kube = FakeKube()
        recorder = EventRecorder(self.kube, instance="t", timestamp=lambda: NOW)
        self.controller = Controller(self.kube, PodConfig(), recorder, now=lambda: NOW)

    def given(self, *objects: dict[str, Any]) -> None:
        for obj in objects:
            store = self.controller.fastpods if obj.get("kind") == keys.FASTPOD_KIND else self.controller.pods
            store.upsert(obj)

    def sync(self, key: str = KEY) -> list[tuple[str, str, str, str]]:
        del self.kube.actions[:]
        self.controller.reconcile(key)
        return self.kube.writes()

    def observe_created(self) -> None:
        """Let the cache see the pods created so far, as the watch would."""
        for created in self.kube.created:
            self.controller.pods.upsert(created)

    def status(self) -> dict[str, Any]:
        return self.kube.statuses[-1]

    def condition(self, kind: str) -> dict[str, Any]:
        return next(c for c in self.status()["conditions"] if c["type"] == kind)


@pytest.fixture
def f() -> Fixture:
    return Fixture()


def test_a_new_fastpod_gets_its_pods_then_a_status_once_the_cache_has_seen_them(f: Fixture) -> None:
    obj = fastpod(replicas=3)
    f.given(obj)
    assert f.sync() == [("create", "pods", NAMESPACE, "web-")] * 3  # a status now would say 0 replicas
    expected = make_pod(parse_fastpod(obj), PodConfig())
    assert all({**p, "metadata": {**p["metadata"], "name": None, "uid": None}} ==
               {**expected, "metadata": {**expected["metadata"], "name": None, "uid": None}} for p in f.kube.created)
    assert [e["reason"] for e in f.kube.events] == ["SuccessfulCreate"]
    assert f.kube.events[0]["message"] == "Created pods: web-00001, web-00002, web-00003"
    f.controller.pods.upsert(f.kube.created[0])
    assert f.sync() == []  # two of its creates are still unobserved
    f.observe_created()
    assert f.sync() == [("patch", "fastpods/status", NAMESPACE, "web")]
    assert (f.status()["replicas"], f.condition(names.CONDITION_PROGRESSING)["reason"]) == (3, "ReplicasUpToDate")


def test_no_more_pods_are_created_until_the_cache_has_seen_the_last_ones(f: Fixture) -> None:
    f.given(fastpod(replicas=3))
    f.sync()
    assert ("create", "pods", NAMESPACE, "web-") not in f.sync()  # the watch has not delivered them yet
    f.observe_created()
    assert ("create", "pods", NAMESPACE, "web-") not in f.sync()
    assert f.status()["replicas"] == 3


def test_a_converged_fastpod_needs_no_writes(f: Fixture) -> None:
    obj = fastpod(replicas=2)
    f.given(obj, pod("web-a", obj), pod("web-b", obj))
    assert f.sync() == [("patch", "fastpods/status", NAMESPACE, "web")]
    f.given({**obj, "status": f.status()})
    assert f.sync() == []


def test_scale_down_deletes_unscheduled_then_not_ready_then_newest(f: Fixture) -> None:
    obj = fastpod(replicas=1)
    f.given(obj,
            pod("ready-old", obj, node="n1", ready=True, created="2026-01-01T00:00:00Z"),
            pod("ready-new", obj, node="n1", ready=True, created="2026-01-01T00:05:00Z"),
            pod("not-ready", obj, node="n1", created="2026-01-01T00:01:00Z"),
            pod("unscheduled", obj, created="2026-01-01T00:00:00Z"))
    assert f.sync() == [("delete", "pods", NAMESPACE, "unscheduled"), ("delete", "pods", NAMESPACE, "not-ready"),
                        ("delete", "pods", NAMESPACE, "ready-new")]
    assert f.kube.events[0]["message"] == "Deleted pods: unscheduled, not-ready, ready-new"


def test_a_pod_deleted_by_hand_is_replaced(f: Fixture) -> None:
    obj = fastpod(replicas=2)
    f.given(obj, pod("web-a", obj), pod("web-b", obj))
    f.controller.pods.delete(pod("web-b", obj))
    assert f.sync()[0] == ("create", "pods", NAMESPACE, "web-")


def test_pods_of_other_owners_and_terminating_pods_do_not_count(f: Fixture) -> None:
    obj = fastpod(replicas=2)
    stranger = pod("stranger", fastpod(uid="uid-older-web"))
    f.given(obj, stranger, pod("web-a", obj), pod("leaving", obj, deleting=True))
    assert [a[0] for a in f.sync()] == ["create"]


def test_an_invalid_share_creates_nothing_and_is_reported_once(f: Fixture) -> None:
    obj = fastpod(annotations=share_annotations(request="0.9", limit="0.5"))
    f.given(obj)
    assert f.sync() == [("patch", "fastpods/status", NAMESPACE, "web")]
    message = ('fastgshare/gpu_quota_request: request "0.9" is greater than fastgshare/gpu_quota_limit "0.5"; '
               "allowed: request <= limit")
    assert f.condition(names.CONDITION_INVALID_SPEC) == {
        "type": "InvalidSpec", "status": "True", "reason": "InvalidShareAnnotations", "message": message,
        "lastTransitionTime": NOW}
    assert f.condition(names.CONDITION_PROGRESSING)["status"] == "False"
    [event] = f.kube.events
    assert (event["type"], event["reason"], event["message"]) == ("Warning", "InvalidSpec", message)
    assert event["involvedObject"]["kind"] == "FaSTPod"
    f.given({**obj, "status": f.status()})
    assert f.sync() == []
    assert len(f.kube.events) == 1


def test_fixing_the_spec_recovers_by_itself(f: Fixture) -> None:
    broken = fastpod(replicas=2, annotations=share_annotations(mem="lots"))
    f.given(broken)
    f.sync()
    f.given({**with_annotations(broken, fastgshare__gpu_mem="2Gi"), "status": f.status()})
    assert [a[0] for a in f.sync()] == ["create", "create"]
    f.observe_created()
    assert [a[0] for a in f.sync()] == ["patch"]
    assert f.condition(names.CONDITION_INVALID_SPEC)["status"] == "False"


def test_a_spec_turning_invalid_leaves_existing_pods_alone(f: Fixture) -> None:
    obj = fastpod(replicas=1)
    running = pod("web-a", obj, node="n1", ready=True)
    f.given(obj, running)
    f.sync()
    f.given({**with_annotations(obj, fastgshare__gpu_sm_partition="150"), "status": f.status()})
    assert f.sync() == [("patch", "fastpods/status", NAMESPACE, "web")]
    assert f.status()["replicas"] == 1
    # what only a valid spec has is removed from the status (a merge patch deletes with null)
    assert (f.status()["updatedReplicas"], f.status()["revision"]) == (None, None)


def test_a_changed_share_replaces_pods_that_are_not_ready_at_once(f: Fixture) -> None:
    old = fastpod(replicas=2)
    changed = with_annotations(old, fastgshare__gpu_sm_partition="30")
    f.given(changed, pod("web-a", old), pod("web-b", old))
    assert f.sync()[:4] == [("delete", "pods", NAMESPACE, "web-b"), ("delete", "pods", NAMESPACE, "web-a"),
                            ("create", "pods", NAMESPACE, "web-"), ("create", "pods", NAMESPACE, "web-")]
    assert f.kube.created[0]["metadata"]["annotations"][keys.GPU_SM_PARTITION] == "30"


def test_a_changed_share_replaces_ready_pods_one_at_a_time(f: Fixture) -> None:
    old = fastpod(replicas=2)
    changed = with_annotations(old, fastgshare__gpu_mem="2Gi")
    f.given(changed, pod("web-a", old, node="n", ready=True), pod("web-b", old, node="n", ready=True,
                                                                  created="2026-01-01T00:00:09Z"))
    assert f.sync()[:2] == [("delete", "pods", NAMESPACE, "web-b"), ("create", "pods", NAMESPACE, "web-")]
    f.controller.pods.delete(pod("web-b", old))
    f.observe_created()
    assert [a[0] for a in f.sync()] == ["patch"]  # the new pod is not ready: wait
    assert f.condition(names.CONDITION_PROGRESSING) == {
        "type": "Progressing", "status": "True", "reason": "RollingUpdate", "lastTransitionTime": NOW,
        "message": "1 pod of an older revision waits until all 2 replicas are ready (one is replaced at a time)"}


def test_a_failed_create_is_reported_and_retried(f: Fixture) -> None:
    f.given(fastpod(replicas=2))
    f.kube.fail("create/pods", ApiError(403, "Forbidden", 'exceeded quota: gpu, requested: pods=1'))
    with pytest.raises(ApiError):
        f.controller.reconcile(KEY)
    assert f.condition(names.CONDITION_PROGRESSING) == {
        "type": "Progressing", "status": "False", "reason": "FailedCreate",
        "message": "cannot create pods: exceeded quota: gpu, requested: pods=1", "lastTransitionTime": NOW}
    assert [e["reason"] for e in f.kube.events] == ["FailedCreate"]
    assert [a[0] for a in f.sync()] == ["create", "create"]  # expectations were released
    f.observe_created()
    assert [a[0] for a in f.sync()] == ["patch"]
    assert f.condition(names.CONDITION_PROGRESSING)["reason"] == "ReplicasUpToDate"  # the failure is over


def test_pods_are_created_in_slow_start_batches_that_stop_at_the_first_failure(f: Fixture) -> None:
    f.given(fastpod(replicas=7))
    # batch of 1 succeeds; in the batch of 2 one create fails; the 4 pods after it are not tried
    f.kube.errors["create/pods"] = [None, None, ApiError(500, "InternalError", "etcd timeout")]  # type: ignore[list-item]
    with pytest.raises(ApiError):
        f.controller.reconcile(KEY)
    assert [a[0] for a in f.kube.actions if a[1] == "pods"] == ["create"] * 3
    assert len(f.kube.created) == 2
    assert f.kube.checked == [False, True, True]  # the first create vouches for the body of the others
    assert f.kube.events[0]["message"] == "Created pods: web-00001, web-00002"
    f.observe_created()
    assert [a[0] for a in f.sync()] == ["create"] * 5  # the 5 missing, in batches of 1, 2, 2


def test_a_pod_spec_the_clients_check_accepted_once_is_not_checked_again(f: Fixture) -> None:
    f.given(fastpod(replicas=1), fastpod("twin", replicas=2, uid="uid-twin"),
            fastpod("other", replicas=1, uid="uid-other", pod_spec={"containers": [{"name": "c", "image": "other:1"}]}))
    f.sync()
    f.sync(f"{NAMESPACE}/twin")  # the same podSpec as web's: the client accepted it already
    f.sync(f"{NAMESPACE}/other")
    assert f.kube.checked == [False, True, True, False]


def test_a_pod_spec_that_was_refused_is_checked_again_next_time(f: Fixture) -> None:
    f.given(fastpod(replicas=2))
    f.kube.fail("create/pods", ApiError(422, "Invalid", "the Kubernetes client refused the body"))
    f.sync()
    del f.kube.errors["create/pods"]
    f.sync()
    assert f.kube.checked == [False, False, True]


def test_accepted_specs_forget_the_least_recently_used_beyond_their_size() -> None:
    accepted = AcceptedSpecs(size=2)
    first, second, third = ({"containers": [{"name": "c", "image": f"i:{n}"}]} for n in range(3))
    accepted.add(first)
    accepted.add(second)
    assert first in accepted  # now the most recently used
    accepted.add(third)
    assert (first in accepted, second in accepted, third in accepted) == (True, False, True)
    assert {"containers": [{"image": "i:0", "name": "c"}]} in accepted  # key order does not matter


class BatchObservingKube(FakeKube):
    """Creates wait until every create of their slow-start batch (1, 2, 4) is in flight at once."""

    def __init__(self) -> None:
        super().__init__()
        one, two, four = (threading.Barrier(size, timeout=5) for size in (1, 2, 4))
        self.batches = [one, two, two, four, four, four, four]  # the barrier of each create, in call order
        self._calls = itertools.count()

    def create_pod(self, namespace: str, body: Mapping[str, Any], *, checked: bool = False) -> dict[str, Any]:
        self.batches[next(self._calls)].wait()
        return super().create_pod(namespace, body, checked=checked)


def test_each_slow_start_batch_is_created_in_parallel() -> None:
    kube = BatchObservingKube()
    controller = Controller(kube, PodConfig(), EventRecorder(kube, instance="t", timestamp=lambda: NOW),
                            now=lambda: NOW)
    controller.fastpods.upsert(fastpod(replicas=7))
    controller.reconcile(KEY)  # a serial create would leave a batch's barrier waiting and break it
    assert len(kube.created) == 7


def test_a_batch_of_one_is_created_in_the_workers_own_thread(f: Fixture) -> None:
    threads: list[threading.Thread] = []
    create = f.kube.create_pod

    def noting_thread(namespace: str, body: Mapping[str, Any], *, checked: bool = False) -> dict[str, Any]:
        threads.append(threading.current_thread())
        return create(namespace, body, checked=checked)

    f.kube.create_pod = noting_thread  # type: ignore[method-assign]
    f.given(fastpod(replicas=3))
    f.sync()
    assert threads[0] is threading.current_thread()  # no hand-off to a creator for a single create
    assert len(threads) == 3


def test_a_failed_delete_releases_all_its_expectations(f: Fixture) -> None:
    old = fastpod(replicas=2)
    changed = with_annotations(old, fastgshare__gpu_quota_request="0.2")
    f.given(changed, pod("web-a", old), pod("web-b", old))
    f.kube.fail("delete/pods", ApiError(500, "InternalError", "etcd timeout"))
    with pytest.raises(ApiError):
        f.controller.reconcile(KEY)
    assert f.condition(names.CONDITION_PROGRESSING)["reason"] == "FailedDelete"
    assert f.controller.expectations.satisfied(KEY)  # the retry acts at once, not after the TTL
    assert [a[0] for a in f.sync()] == ["delete", "delete", "create", "create"]


def test_a_pod_the_api_server_rejects_makes_the_spec_invalid(f: Fixture) -> None:
    f.given(fastpod(replicas=1))
    f.kube.fail("create/pods", ApiError(422, "Invalid", 'Pod "web-x" is invalid: spec.containers[0].image: Required'))
    f.controller.reconcile(KEY)  # not retried: only a changed FaSTPod can help
    assert f.condition(names.CONDITION_INVALID_SPEC)["reason"] == "PodRejected"
    assert "spec.containers[0].image: Required" in f.condition(names.CONDITION_INVALID_SPEC)["message"]


def test_a_rejected_pod_names_the_fastpod_field_once(f: Fixture) -> None:
    """Issue 15, defect 2: the refused field is named as the user wrote it, in one Warning event."""
    obj = fastpod(replicas=1)
    f.given(obj)
    refusal = ApiError(422, "Invalid", "refused", (("spec.metadata", "unknown field"),))
    f.kube.fail("create/pods", refusal, refusal)
    f.controller.reconcile(KEY)
    message = f.condition(names.CONDITION_INVALID_SPEC)["message"]
    assert message == "the pod built from this FaSTPod is invalid: spec.podSpec.metadata: unknown field"
    f.given({**obj, "status": f.status()})  # the watch brings the status back
    f.controller.reconcile(KEY)
    assert [(e["type"], e["reason"], e["message"]) for e in f.kube.events] == [("Warning", "InvalidSpec", message)]
    assert f.kube.event_patches == []


def test_a_fastpod_gone_from_the_cache_needs_nothing(f: Fixture) -> None:
    assert f.sync("team-a/nothing") == []


def test_a_fastpod_being_deleted_is_left_to_the_garbage_collector(f: Fixture) -> None:
    obj = fastpod(replicas=3)
    obj["metadata"]["deletionTimestamp"] = NOW
    f.given(obj)
    assert [a[0] for a in f.sync()] == ["patch"]


def test_status_shows_each_pods_node_and_gpu(f: Fixture) -> None:
    obj = fastpod(replicas=2)
    assignment = encode_assignment(PodAssignment(node_name="gpu-node-1", gpu_uuid="GPU-1234", gpu_index=3,
                                                 share=make_share(), assigned_at_ms=1))
    f.given(obj, pod("web-a", obj, node="gpu-node-1", ready=True, phase="Running", assignment=assignment),
            pod("web-b", obj))
    f.sync()
    status = copy.deepcopy(f.status())
    conditions = status.pop("conditions")
    assert status == {
        "replicas": 2, "readyReplicas": 1, "availableReplicas": 1, "updatedReplicas": 2, "observedGeneration": 1,
        "selector": "fastgshare.caps.in.tum/fastpod=web", "revision": parse_fastpod(obj).revision, "memory": "1 GiB",
        "pods": [{"name": "web-a", "phase": "Running", "ready": True, "node": "gpu-node-1", "gpu": "GPU-1234",
                  "gpuIndex": 3},
                 {"name": "web-b", "phase": "Pending", "ready": False}],
    }
    assert conditions[0] == {"type": "Available", "status": "False", "reason": "ReplicasUnavailable",
                             "message": "1 of 2 replicas ready", "lastTransitionTime": NOW}


def test_a_hostile_share_value_is_an_invalid_spec_not_an_endless_retry(f: Fixture) -> None:
    """Issue 15, defect 9: a share value of thousands of digits raised ValueError in reconcile,
    which the work queue retries forever."""
    f.given(with_annotations(fastpod(replicas=1), fastgshare__gpu_sm_partition="1" * 5000))
    f.controller.reconcile(KEY)
    condition = f.condition(names.CONDITION_INVALID_SPEC)
    assert (condition["status"], condition["reason"]) == ("True", "InvalidShareAnnotations")
    assert "is 5000 characters long" in condition["message"]
    assert len(condition["message"]) < 1000
