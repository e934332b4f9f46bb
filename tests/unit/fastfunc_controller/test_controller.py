"""The function controller's reconcile with a fake API: what it writes, and what it does on conflicts."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from fastfunc_controller.controller import Controller
from fastgshare import keys
from fastgshare_kube.errors import ApiError
from fastgshare_kube.events import EventRecorder

FN = {"apiVersion": keys.FASTFUNC_API_VERSION, "kind": keys.FASTFUNC_KIND,
      "metadata": {"name": "resnet", "namespace": "fn", "uid": "u1", "generation": 1},
      "spec": {"podSpec": {"containers": [{"name": "fn", "image": "x"}]}, "memory": "1Gi",
               "fixed": {"quotaRequest": "0.4", "smPartition": 12, "replicas": 1}}}


class FakeKube:
    def __init__(self, refuse_service: ApiError | None = None) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.events: list[Mapping[str, Any]] = []
        self._refuse_service = refuse_service

    def create_fastpod(self, namespace: str, body: Mapping[str, Any]) -> None:
        self.calls.append(("create_fastpod", body["metadata"]["name"]))

    def patch_fastpod(self, namespace: str, name: str, operations: Any) -> None:
        self.calls.append(("patch_fastpod", name))

    def delete_fastpod(self, namespace: str, name: str, uid: str) -> None:
        self.calls.append(("delete_fastpod", name))

    def create_service(self, namespace: str, body: Mapping[str, Any]) -> None:
        if self._refuse_service is not None:
            raise self._refuse_service
        self.calls.append(("create_service", body["metadata"]["name"]))

    def patch_service(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        self.calls.append(("patch_service", name))

    def patch_fastfunc_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        self.calls.append(("status", copy.deepcopy(dict(status))))

    def create_event(self, namespace: str, body: Mapping[str, Any]) -> None:
        self.events.append(body)

    def patch_event(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        pass


def controller(kube: FakeKube) -> Controller:
    recorder = EventRecorder(kube, component="test", instance="t", api_version=keys.FASTFUNC_API_VERSION,
                             kind=keys.FASTFUNC_KIND)
    made = Controller(kube, recorder, now=lambda: "2026-01-01T00:00:00Z")
    made.fastfuncs.upsert(copy.deepcopy(FN))
    return made


def test_a_new_function_gets_its_fastpod_service_and_status() -> None:
    kube = FakeKube()
    assert controller(kube).reconcile("fn/resnet") == "synced"
    assert [call[0] for call in kube.calls] == ["create_fastpod", "create_service", "status"]
    assert kube.calls[0][1] == "resnet-q40-s12"
    assert [event["reason"] for event in kube.events] == ["SuccessfulCreate", "SuccessfulCreate"]


def test_a_service_of_someone_else_is_a_conflict_not_a_retry_loop() -> None:
    kube = FakeKube(refuse_service=ApiError(409, "AlreadyExists", 'services "resnet" already exists'))
    assert controller(kube).reconcile("fn/resnet") == "synced"
    [status] = [call[1] for call in kube.calls if call[0] == "status"]
    ready = status["conditions"][0]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "False", "ServiceConflict")
    assert "a Service resnet exists in fn that this FaSTFunc does not own" in ready["message"]
    assert [e["reason"] for e in kube.events if e["type"] == "Warning"] == ["ServiceConflict"]


def test_a_deleted_function_is_left_to_the_garbage_collector() -> None:
    kube = FakeKube()
    made = controller(kube)
    made.fastfuncs.delete(FN)
    assert made.reconcile("fn/resnet") == "gone"
    assert kube.calls == []


SCHEDULER_SAYS = "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity."


def child_pod(name: str, fastpod_uid: str, *, stuck: bool, function: str = "resnet") -> dict[str, Any]:
    """A pod of the FaSTPod controller: the child's labels, its controller owner reference."""
    scheduled = ({"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": SCHEDULER_SAYS}
                 if stuck else {"type": "PodScheduled", "status": "True"})
    return {"metadata": {"name": name, "namespace": "fn", "labels": {keys.FUNCTION_LABEL: function},
                         "ownerReferences": [{"kind": keys.FASTPOD_KIND, "name": "resnet-q40-s12",
                                              "uid": fastpod_uid, "controller": True}]},
            "status": {"phase": "Pending", "conditions": [scheduled]}}


def with_child(made: Controller) -> str:
    """Put the function's FaSTPod in the cache, as the watch would after the create; its uid."""
    made.fastpods.upsert({"apiVersion": keys.FASTPOD_API_VERSION, "kind": keys.FASTPOD_KIND,
                          "metadata": {"name": "resnet-q40-s12", "namespace": "fn", "uid": "fp1",
                                       "ownerReferences": [{"kind": keys.FASTFUNC_KIND, "name": "resnet", "uid": "u1",
                                                            "controller": True}]}})
    return "fp1"


def unschedulable_of(kube: FakeKube) -> dict[str, Any]:
    [status] = [call[1] for call in kube.calls if call[0] == "status"][-1:]
    [condition] = [c for c in status["conditions"] if c["type"] == "Unschedulable"]
    return condition


def test_a_pod_change_enqueues_the_function_its_label_names() -> None:
    made = controller(FakeKube())
    while (key := made.queue.get(0)) is not None:
        made.queue.done(key)
    made.pods.upsert(child_pod("resnet-q40-s12-a", "fp1", stuck=False))
    assert made.queue.get(0) == "fn/resnet"


def test_an_unschedulable_pod_sets_the_condition_and_one_warning_event() -> None:
    kube = FakeKube()
    made = controller(kube)
    uid = with_child(made)
    made.pods.upsert(child_pod("resnet-q40-s12-a", uid, stuck=True))
    made.pods.upsert(child_pod("resnet-q40-s12-b", uid, stuck=False))
    made.pods.upsert(child_pod("other-q40-s12-c", "someone-else", stuck=True))  # not a child's pod
    made.reconcile("fn/resnet")
    condition = unschedulable_of(kube)
    assert (condition["status"], condition["reason"]) == ("True", "PodsUnschedulable")
    assert condition["message"] == ("1 of 2 pods of the function cannot be scheduled; pod resnet-q40-s12-a: "
                                    + SCHEDULER_SAYS)
    warnings = [e for e in kube.events if e["type"] == "Warning"]
    assert [(e["reason"], e["message"]) for e in warnings] == [("PodsUnschedulable", condition["message"])]

    # The status came back through the watch: the condition stays True, no second event.
    stored = made.fastfuncs.get("fn/resnet")
    assert stored is not None
    stored["status"] = {"conditions": [dict(condition)]}
    made.fastfuncs.upsert(stored)
    made.pods.upsert(child_pod("resnet-q40-s12-b", uid, stuck=True))
    made.reconcile("fn/resnet")
    assert unschedulable_of(kube)["message"].startswith("2 of 2 pods of the function cannot be scheduled")
    assert len([e for e in kube.events if e["type"] == "Warning"]) == 1

    made.pods.delete(child_pod("resnet-q40-s12-a", uid, stuck=True))
    made.pods.upsert(child_pod("resnet-q40-s12-b", uid, stuck=False))
    made.reconcile("fn/resnet")
    assert (unschedulable_of(kube)["status"], unschedulable_of(kube)["reason"]) == ("False", "PodsSchedulable")
