"""Fixtures of the extender's unit tests: an in-memory API (``FakeKube``), builders, the app.

The app is wired by the same :func:`scheduler_extender.services.build_services` production uses,
with ``FakeKube`` in place of the kubernetes adapter. Nothing here touches a network.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator, Mapping

import attrs
import flask
import pytest

from fastgshare import keys
from fastgshare.codec import PodAssignment, encode_assignment, encode_node_inventory
from fastgshare.inventory import GpuDevice, NodeInventory
from scheduler_extender.config import ExtenderConfig
from scheduler_extender.http.apps import create_app
from scheduler_extender.ports import ApiConflict, PodNotFound
from scheduler_extender.records import NodeRecord, PodRecord
from scheduler_extender.services import Services, build_services
from scheduler_extender.state import ClusterState
from tests.builders import TEST_TRUST, make_gpu, make_share, share_annotations, signed_annotations

GiB = 2**30


def node_record(name: str, gpus: int | list[GpuDevice] = 2, *, slots: int = keys.DEFAULT_SLOTS_PER_GPU,
                mem: int = 16 * GiB) -> NodeRecord:
    """A node with the node agent's inventory annotation (GPUs with uuids unique to the node)."""
    devices = gpus if isinstance(gpus, list) else [make_gpu(i, mem=mem, uuid=f"GPU-{name}-{i}") for i in range(gpus)]
    inventory = NodeInventory(node_name=name, gpus=tuple(devices), slots_per_gpu=slots)
    return NodeRecord(name=name, inventory_text=encode_node_inventory(inventory))


_uids = itertools.count(1)


def pod_record(name: str, *, namespace: str = "team-a", uid: str | None = None, node_name: str = "",
               annotations: dict[str, str] | None = None, assignment: PodAssignment | None = None,
               allocated: bool = False, phase: str = "Pending", resource_version: str = "10",
               signed: bool = True) -> PodRecord:
    """A pod asking for the default test share (0.4..0.8 of the time, 50 % SM, 1 GiB) unless told otherwise;
    its ``assignment`` signed with the test key unless ``signed`` is False (a forgery)."""
    values = dict(share_annotations() if annotations is None else annotations)
    uid = uid or f"uid-{name}-{next(_uids)}"
    if assignment is not None:
        values.update(signed_annotations(uid, assignment) if signed
                      else {keys.POD_ASSIGNMENT_ANNOTATION: encode_assignment(assignment)})
    if allocated:
        values[keys.POD_ALLOCATED_ANNOTATION] = "2026-11-29T00:00:00+00:00"
    return PodRecord(uid=uid, namespace=namespace, name=name, node_name=node_name,
                     phase=phase, resource_version=resource_version, annotations=values)


def assignment(node: str, gpu: int = 0, *, request: int = 400, sm: int = 50, mem: int = GiB,
               at_ms: int = 1_000) -> PodAssignment:
    return PodAssignment(node_name=node, gpu_uuid=f"GPU-{node}-{gpu}", gpu_index=gpu,
                         share=make_share(request=request, limit=max(request, 800), sm=sm, mem=mem),
                         assigned_at_ms=at_ms)


def pod_json(pod: PodRecord) -> dict[str, object]:
    """The pod as the scheduler embeds it in ExtenderArgs."""
    return {"metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid,
                         "resourceVersion": pod.resource_version, "annotations": dict(pod.annotations)},
            "spec": {"containers": [{"name": "main", "resources": {"limits": {keys.VGPU_RESOURCE: "1"}}}],
                     "schedulerName": keys.SCHEDULER_NAME},
            "status": {"phase": pod.phase}}


class FakeKube:
    """An in-memory API server for bind: pods by key, every call recorded in ``actions``.

    Bindings behave as from Kubernetes 1.23 on: the pod's uid and resourceVersion named in the
    Binding are preconditions (409), and its annotations are copied onto the pod in the same write.
    ``watch`` (if set) receives every written pod, as the cache's watch would.
    """

    def __init__(self) -> None:
        self.pods: dict[str, PodRecord] = {}
        self.actions: list[tuple[str, ...]] = []
        self.conflicts_before_write = 0  # the pod changes (a new resourceVersion) just before this many writes
        self.binding_error: Exception | None = None
        self.watch: Callable[[PodRecord], None] | None = None
        self._versions = itertools.count(1000)
        self._lock = threading.Lock()

    def add(self, pod: PodRecord) -> PodRecord:
        self.pods[pod.key] = pod
        return pod

    def writes(self) -> list[tuple[str, ...]]:
        """The actions that wrote (or tried to write): everything but reads."""
        return [action for action in self.actions if action[0] != "get"]

    def read_pod(self, namespace: str, name: str) -> PodRecord | None:
        with self._lock:
            self.actions.append(("get", f"{namespace}/{name}"))
            return self.pods.get(f"{namespace}/{name}")

    def _changed_meanwhile(self, current: PodRecord) -> PodRecord:
        if self.conflicts_before_write:
            self.conflicts_before_write -= 1
            current = attrs.evolve(current, resource_version=str(next(self._versions)))
            self.pods[current.key] = current
        return current

    def patch_pod_annotation(self, pod: PodRecord, key: str, value: str | None) -> PodRecord:
        return self.patch_pod_annotations(pod, {key: value})

    def patch_pod_annotations(self, pod: PodRecord, changes: Mapping[str, str | None]) -> PodRecord:
        with self._lock:
            self.actions.append(("patch", pod.key, *changes,
                                 *("set" if value is not None else "remove" for value in changes.values())))
            current = self.pods.get(pod.key)
            if current is None or current.uid != pod.uid:
                raise PodNotFound(f"pods {pod.name} not found")
            current = self._changed_meanwhile(current)
            if current.resource_version != pod.resource_version:
                raise ApiConflict("the object has been modified")
            annotations = {k: v for k, v in current.annotations.items() if k not in changes}
            annotations.update({k: v for k, v in changes.items() if v is not None})
            updated = attrs.evolve(current, annotations=annotations, resource_version=str(next(self._versions)))
            self.pods[pod.key] = updated
        self._notify(updated)
        return updated

    def create_binding(self, pod: PodRecord, node: str, annotations: Mapping[str, str] | None = None) -> None:
        with self._lock:
            self.actions.append(("bind", pod.key, node, *sorted(annotations or {})))
            if self.binding_error is not None:
                raise self.binding_error
            current = self.pods.get(pod.key)
            if current is None:
                raise PodNotFound(f"pods {pod.name} not found")
            current = self._changed_meanwhile(current)
            if current.uid != pod.uid:
                raise ApiConflict(f"Precondition failed: UID in precondition: {pod.uid}, UID in object meta: "
                                  f"{current.uid}")
            if current.node_name:
                raise ApiConflict(f"pod {pod.name} is already assigned to node {current.node_name}")
            if pod.resource_version and current.resource_version != pod.resource_version:
                raise ApiConflict("the object has been modified")
            updated = attrs.evolve(current, node_name=node, annotations={**current.annotations, **(annotations or {})},
                                   resource_version=str(next(self._versions)))
            self.pods[pod.key] = updated
        self._notify(updated)

    def mark_allocated(self, key: str) -> None:
        """What the node agent does after Allocate."""
        with self._lock:
            current = self.pods[key]
            updated = attrs.evolve(current, annotations={**current.annotations,
                                                        keys.POD_ALLOCATED_ANNOTATION: "now"})
            self.pods[key] = updated
        self._notify(updated)

    def _notify(self, pod: PodRecord) -> None:
        if self.watch is not None:
            self.watch(pod)


def synced_state(*nodes: NodeRecord, bind_wait_s: float = 0.0, pods: tuple[PodRecord, ...] = (),
                 now_ms: Callable[[], int] | None = None, bind_window: int = 1) -> ClusterState:
    state = ClusterState(bind_wait_s=bind_wait_s, bind_window=bind_window, trust=TEST_TRUST,
                         **({"now_ms": now_ms} if now_ms else {}))
    state.replace_nodes(nodes)
    state.replace_pods(pods, state.begin_relist())
    return state


@pytest.fixture
def kube() -> FakeKube:
    return FakeKube()


@pytest.fixture
def state() -> ClusterState:
    return synced_state(node_record("node-a"), node_record("node-b"))


@pytest.fixture
def services(state: ClusterState, kube: FakeKube) -> Services:
    kube.watch = state.upsert_pod
    return build_services(ExtenderConfig(bind_wait_s=0.0, max_body_bytes=64 * 1024), state, kube)


@pytest.fixture
def app(services: Services) -> flask.Flask:
    return create_app(services, {"TESTING": True})


@pytest.fixture
def client(app: flask.Flask) -> Iterator[flask.testing.FlaskClient]:
    with app.test_client() as test_client:
        yield test_client
