"""The node agent against the real API server: Allocate finds the right pod, marks it, refuses when none.

The agent runs with its real adapters (the watch-fed pod cache and the writer), simulated
GPUs, and a fake kubelet on unix sockets driving the real gRPC edge. Pods are bound to the node
as the extender's bind leaves them: a Binding that writes the assignment, signed with the test
key (tests.builders), for the pod's own share annotations. The agent deletes no pod: what it
refuses is reported as Warning events on the pod, which these tests read from the API.
"""

from __future__ import annotations

import contextlib
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import grpc
import kubernetes.client
import pytest

from device_plugin._api import deviceplugin_pb2 as api
from device_plugin._api import deviceplugin_pb2_grpc as api_grpc
from device_plugin.agent import NodeAgent
from device_plugin.allocation import Allocator, HostPaths, NodePod
from device_plugin.devices import DeviceState
from device_plugin.discovery import SimulatedGpus
from device_plugin.kube import REASON_ASSIGNMENT_REFUSED, KubeWriter, NodePods
from device_plugin.pod_resources import PodResourcesClient
from device_plugin.servicer import REASON_START_REFUSED, DevicePluginServicer
from fastgshare import keys
from fastgshare.codec import PodAssignment, decode_node_inventory, encode_assignment
from fastgshare.inventory import GpuDevice, parse_gpu_spec
from fastgshare.share import share_annotations
from fastgshare_kube import rest
from fastgshare_kube.rest import RawListWatch
from tests.builders import TEST_TRUST, make_share, signed_annotations
from tests.cluster.conftest import unique_name
from tests.cluster.controlplane import wait_until
from tests.fake_kubelet import FakeKubelet, FakePodResources

UNSCHEDULED = "no-scheduler.fastgshare.test"  # no scheduler binds a pod of this name: the tests do


@attrs.define
class AgentUnderTest:
    node: str
    gpus: tuple[GpuDevice, ...]
    pods: NodePods
    kubelet: FakeKubelet
    pod_resources: FakePodResources | None = None

    def allocate(self, device_id: str = "x::0") -> api.AllocateResponse:
        with self.kubelet.plugin_channel(keys.DEVICE_PLUGIN_SOCKET) as channel:
            request = api.AllocateRequest(container_requests=[api.ContainerAllocateRequest(devices_ids=[device_id])])
            return api_grpc.DevicePluginStub(channel).Allocate(request, timeout=30)

    def pre_start(self, device_id: str) -> None:
        with self.kubelet.plugin_channel(keys.DEVICE_PLUGIN_SOCKET) as channel:
            api_grpc.DevicePluginStub(channel).PreStartContainer(
                api.PreStartContainerRequest(devices_ids=[device_id]), timeout=30)


@contextlib.contextmanager
def running_agent(api_client: kubernetes.client.ApiClient, core: kubernetes.client.CoreV1Api, *,
                  kubelet_record: bool) -> Iterator[AgentUnderTest]:
    """The agent on a fresh node, wired as ``device_plugin.main`` wires it (the test key's trust, refused
    assignments reported as events); with ``kubelet_record``, kubelet serves its PodResources record."""
    node = unique_name("agent-node")
    core.create_node(kubernetes.client.V1Node(metadata=kubernetes.client.V1ObjectMeta(
        name=node, annotations={"team.example/owner": "ml-platform"})))
    with tempfile.TemporaryDirectory(prefix="fgs-") as directory:
        plugin_dir = Path(directory) / "dp"
        plugin_dir.mkdir()
        kubelet = FakeKubelet(plugin_dir)
        kubelet.start()
        pod_resources = FakePodResources(Path(directory) / "pod-resources.sock") if kubelet_record else None
        if pod_resources is not None:
            pod_resources.start()
        record = (PodResourcesClient(pod_resources.socket_path, keys.VGPU_RESOURCE)
                  if pod_resources is not None else None)
        gpus = SimulatedGpus(parse_gpu_spec("4x16GiB:80sm"), node)
        writer = KubeWriter(api_client)
        pods = NodePods(api_client, node, trust=TEST_TRUST,
                        report=lambda pod, message: writer.warn(pod, REASON_ASSIGNMENT_REFUSED, message))
        devices = DeviceState(node, gpus.devices(), slots_per_gpu=8)
        allocator = Allocator(node, HostPaths(hook_library=f"{directory}/lib/hook.so", run_dir=f"{directory}/run",
                                              mps_pipe_dir="/tmp/nvidia-mps"))
        stopping = threading.Event()
        node_agent = NodeAgent(devices=devices, backend=gpus, publisher=writer, plugin_dir=plugin_dir,
                               stopping=stopping, retry_s=0.2,
                               make_servicer=lambda: DevicePluginServicer(devices, allocator, pods, writer,
                                                                          stopping=stopping, allocate_wait_s=5,
                                                                          kubelet_record=record))
        pods.start()
        try:
            assert pods.wait_synced(30)
            node_agent.start()
            assert kubelet.wait_for_registrations(1)
            yield AgentUnderTest(node, gpus.devices(), pods, kubelet, pod_resources)
        finally:
            node_agent.stop()
            pods.stop()
            kubelet.stop()
            if pod_resources is not None:
                pod_resources.stop()
            core.delete_node(node)


@pytest.fixture
def agent(api_client: kubernetes.client.ApiClient, core: kubernetes.client.CoreV1Api) -> Iterator[AgentUnderTest]:
    """The agent with a kubelet that has no PodResources API: it relies on its annotations."""
    with running_agent(api_client, core, kubelet_record=False) as running:
        yield running


@pytest.fixture
def recorded_agent(api_client: kubernetes.client.ApiClient,
                   core: kubernetes.client.CoreV1Api) -> Iterator[AgentUnderTest]:
    """The agent with a kubelet that serves PodResources, as kubelet 1.20 and later do."""
    with running_agent(api_client, core, kubelet_record=True) as running:
        yield running


def bound_pod(core: kubernetes.client.CoreV1Api, namespace: str, name: str, node: str, gpu: GpuDevice | None,
              *, at_ms: int = 0, signed: bool = True, owner: kubernetes.client.V1ConfigMap | None = None) -> str:
    """A pod as the extender's bind leaves it (its uid): created unbound with its share annotations,
    then bound to ``node`` by a Binding that writes its assignment and, unless ``signed`` is False
    (a forgery), the extender's signature for it. ``gpu`` None: bound with no assignment."""
    share = make_share(request=200, limit=500, sm=25)
    metadata: dict[str, Any] = {"name": name, "annotations": share_annotations(share)}
    if owner is not None:
        metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "ConfigMap", "name": owner.metadata.name,
                                        "uid": owner.metadata.uid, "controller": True}]
    created = core.create_namespaced_pod(namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": metadata,
        "spec": {"schedulerName": UNSCHEDULED, "containers": [{
            "name": "main", "image": "registry.invalid/none:0",
            "resources": {"limits": {keys.VGPU_RESOURCE: "1"}}}]},
    })
    uid: str = created.metadata.uid
    annotations: dict[str, str] = {}
    if gpu is not None:
        assignment = PodAssignment(node_name=node, gpu_uuid=gpu.uuid, gpu_index=gpu.index, share=share,
                                   assigned_at_ms=at_ms)
        annotations = (signed_annotations(uid, assignment) if signed
                       else {keys.POD_ASSIGNMENT_ANNOTATION: encode_assignment(assignment)})
    binding = {"apiVersion": "v1", "kind": "Binding",
               "metadata": {"name": name, "namespace": namespace, "uid": uid, "annotations": annotations},
               "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
    rest.send(core.api_client, "POST", rest.namespaced_path("v1", namespace, "pods", name, "binding"), binding)
    return uid


def warnings_on(core: kubernetes.client.CoreV1Api, namespace: str, uid: str) -> list[tuple[str, str, str]]:
    """(type, reason, message) of the events on the pod with ``uid``, as ``kubectl describe`` lists them."""
    events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.uid={uid}").items
    return [(event.type, event.reason, event.message) for event in events]


def test_inventory_is_published_without_touching_other_annotations(
        agent: AgentUnderTest, core: kubernetes.client.CoreV1Api) -> None:
    def published() -> bool:
        return keys.NODE_GPU_INFO_ANNOTATION in (core.read_node(agent.node).metadata.annotations or {})

    wait_until(published, what="the inventory annotation", timeout_s=30)
    annotations = core.read_node(agent.node).metadata.annotations
    assert annotations["team.example/owner"] == "ml-platform"
    inventory = decode_node_inventory(annotations[keys.NODE_GPU_INFO_ANNOTATION])
    assert [gpu.uuid for gpu in inventory.gpus] == [gpu.uuid for gpu in agent.gpus]
    assert inventory.slots_per_gpu == 8


def test_allocate_finds_the_right_pod_marks_it_and_refuses_when_none(
        agent: AgentUnderTest, core: kubernetes.client.CoreV1Api, namespace: str) -> None:
    bound_pod(core, namespace, "no-assignment", agent.node, None)
    bound_pod(core, namespace, "second", agent.node, agent.gpus[3], at_ms=2_000)
    bound_pod(core, namespace, "first", agent.node, agent.gpus[2], at_ms=1_000)
    bound_pod(core, namespace, "other-node", "some-other-node", agent.gpus[0], at_ms=10)

    # kubelet admits pods in the order they arrive on the node (its watch and the agent's see the
    # same order), not by assignment time: "second" was bound first.
    envs = [dict(agent.allocate().container_responses[0].envs) for _ in range(2)]
    assert [(e["FASTGSHARE_POD"], e["NVIDIA_VISIBLE_DEVICES"]) for e in envs] == [
        (f"{namespace}/second", agent.gpus[3].uuid), (f"{namespace}/first", agent.gpus[2].uuid)]
    for name in ("first", "second"):
        annotations = core.read_namespaced_pod(name, namespace).metadata.annotations
        assert keys.POD_ALLOCATED_ANNOTATION in annotations
    assert keys.POD_ALLOCATED_ANNOTATION not in (
        core.read_namespaced_pod("no-assignment", namespace).metadata.annotations or {})

    with pytest.raises(grpc.RpcError) as refused:
        agent.allocate()
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert f"no pod bound to node {agent.node} is waiting for a GPU" in refused.value.details()


def test_twenty_pods_in_quick_succession_each_get_their_assigned_gpu(
        agent: AgentUnderTest, core: kubernetes.client.CoreV1Api, namespace: str) -> None:
    expected = {}
    for i in range(20):
        gpu = agent.gpus[i % len(agent.gpus)]
        name = f"burst-{i:02d}"
        expected[f"{namespace}/{name}"] = gpu.uuid
        bound_pod(core, namespace, name, agent.node, gpu, at_ms=10_000 + i)
        # Like kubelet admitting each pod as soon as it is bound: no waiting for the cache.
        envs = agent.allocate().container_responses[0].envs
        assert (envs["FASTGSHARE_POD"], envs["NVIDIA_VISIBLE_DEVICES"]) == (f"{namespace}/{name}", gpu.uuid)
    marked = {f"{namespace}/{pod.metadata.name}" for pod in core.list_namespaced_pod(namespace).items
              if keys.POD_ALLOCATED_ANNOTATION in (pod.metadata.annotations or {})}
    assert marked == set(expected)


@contextlib.contextmanager
def cached_single_pod(api_client: kubernetes.client.ApiClient, core: kubernetes.client.CoreV1Api, namespace: str,
                      name: str) -> Iterator[NodePod]:
    """A pod bound to a fresh node, and its record as the node agent's synced cache sees it."""
    node = unique_name(f"{name}-node")
    bound_pod(core, namespace, name, node, None)
    pods = NodePods(api_client, node, trust=TEST_TRUST)
    pods.start()
    try:
        assert pods.wait_synced(30)
        [record] = pods.snapshot()[1]
        yield record
    finally:
        pods.stop()


def test_marking_retries_after_a_conflict(api_client: kubernetes.client.ApiClient,
                                          core: kubernetes.client.CoreV1Api, namespace: str) -> None:
    with cached_single_pod(api_client, core, namespace, "racy") as stale:
        core.patch_namespaced_pod("racy", namespace, {"metadata": {"labels": {"touched": "yes"}}})
        assert KubeWriter(api_client).mark_allocated(stale, "now")
    pod = core.read_namespaced_pod("racy", namespace)
    assert pod.metadata.annotations[keys.POD_ALLOCATED_ANNOTATION] == "now"
    assert pod.metadata.labels["touched"] == "yes"


def test_marking_a_pod_that_was_replaced_is_refused(api_client: kubernetes.client.ApiClient,
                                                    core: kubernetes.client.CoreV1Api, namespace: str) -> None:
    with cached_single_pod(api_client, core, namespace, "phoenix") as old:
        core.delete_namespaced_pod("phoenix", namespace, grace_period_seconds=0)
        bound_pod(core, namespace, "phoenix", old.node_name, None)
        assert not KubeWriter(api_client).mark_allocated(old, "now")
    assert keys.POD_ALLOCATED_ANNOTATION not in (
        core.read_namespaced_pod("phoenix", namespace).metadata.annotations or {})


def test_a_refused_container_is_a_warning_event_on_that_pod_and_no_pod_is_deleted(
        recorded_agent: AgentUnderTest, core: kubernetes.client.CoreV1Api, namespace: str) -> None:
    """Issue 42, row 4: the agent used to delete a refused pod of a controller (so that it made a new
    one); a forged pod could make it delete innocent ones. Now kubelet admitting a pod the agent did
    not expect (here: its record names "admitted" as the holder of the devices Allocate gave
    "expected") stops that container's start, however often kubelet retries, with a Warning event on
    that pod in the API; no pod is deleted."""
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    gpus = recorded_agent.gpus
    uids = {name: bound_pod(core, namespace, name, recorded_agent.node, gpu, at_ms=at_ms, owner=owner)
            for name, gpu, at_ms in (("expected", gpus[0], 1_000), ("admitted", gpus[1], 2_000))}
    device = f"{gpus[0].uuid}::0"
    envs = recorded_agent.allocate(device).container_responses[0].envs
    assert envs["FASTGSHARE_POD"] == f"{namespace}/expected"  # it arrived first
    assert recorded_agent.pod_resources is not None
    recorded_agent.pod_resources.give(namespace, "admitted", "main", keys.VGPU_RESOURCE, [device])

    for _ in range(3):  # kubelet tries the start again and again
        with pytest.raises(grpc.RpcError) as refused:
            recorded_agent.pre_start(device)
        assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        details = refused.value.details()
        assert details.startswith(f"fastgshare: refused to start a container of pod {namespace}/admitted")
        assert f"is assigned GPU {gpus[1].uuid}" in details
        assert details.endswith("delete the pod and ConfigMap/owner makes a new one")

    def refusals(uid: str) -> list[tuple[str, str, str]]:
        return [event for event in warnings_on(core, namespace, uid) if event[1] == REASON_START_REFUSED]

    wait_until(lambda: bool(refusals(uids["admitted"])), what="a GPUContainerRefused event on the admitted pod",
               timeout_s=30)
    assert {(kind, message) for kind, _, message in refusals(uids["admitted"])} == {("Warning", details)}
    assert refusals(uids["expected"]) == []
    for name, uid in uids.items():  # both pods are still there, the same pods, not being deleted
        pod = core.read_namespaced_pod(name, namespace)
        assert (pod.metadata.uid, pod.metadata.deletion_timestamp) == (uid, None), name
    assert not hasattr(KubeWriter, "delete_refused")


def test_a_forged_assignment_is_not_served_and_a_warning_event_says_why(
        agent: AgentUnderTest, core: kubernetes.client.CoreV1Api, namespace: str) -> None:
    """Issue 42, row 1: a pod bound with an assignment the extender did not sign (anyone who may
    patch a pod can write one) gets no GPU, and an event on it says why; a signed pod is served."""
    forged = bound_pod(core, namespace, "forged", agent.node, agent.gpus[0], at_ms=1_000, signed=False)

    def refused() -> list[tuple[str, str, str]]:
        return [event for event in warnings_on(core, namespace, forged) if event[1] == REASON_ASSIGNMENT_REFUSED]

    wait_until(lambda: bool(refused()), what="an AssignmentRefused event on the forged pod", timeout_s=30)
    [(kind, _, message)] = refused()
    assert kind == "Warning"
    assert "carries no signature of the fastgshare scheduler extender" in message
    with pytest.raises(grpc.RpcError) as nothing:
        agent.allocate()
    assert nothing.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert f"no pod bound to node {agent.node} is waiting for a GPU" in nothing.value.details()

    bound_pod(core, namespace, "genuine", agent.node, agent.gpus[1], at_ms=2_000)
    envs = agent.allocate().container_responses[0].envs
    assert (envs["FASTGSHARE_POD"], envs["NVIDIA_VISIBLE_DEVICES"]) == (f"{namespace}/genuine", agent.gpus[1].uuid)
    assert keys.POD_ALLOCATED_ANNOTATION not in (core.read_namespaced_pod("forged", namespace).metadata.annotations
                                                 or {})
    assert core.read_namespaced_pod("forged", namespace).metadata.deletion_timestamp is None


def cached(api_client: kubernetes.client.ApiClient, node: str) -> list[NodePod]:
    """The pods a freshly synced cache of the node agent shows on ``node``."""
    pods = NodePods(api_client, node, trust=TEST_TRUST)
    pods.start()
    try:
        assert pods.wait_synced(30)
        return pods.snapshot()[1]
    finally:
        pods.stop()


class ExpiringOnce:
    """The first watch ends as the API server ends an expired one: an ERROR event, Status 410 Gone.

    The API server keeps at least 75 s of pod events in its watch cache, too long for a
    test to wait for a real expiry; the event is the one the server sends then.
    """

    expired = 0
    real_watch = RawListWatch.watch

    @staticmethod
    def watch(source: RawListWatch, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        if ExpiringOnce.expired == 0:
            ExpiringOnce.expired += 1
            yield {"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                               "message": "too old resource version", "reason": "Expired",
                                               "code": 410}}
            return
        yield from ExpiringOnce.real_watch(source, resource_version, timeout_s)


def test_pod_cache_relists_after_410_and_follows_the_api(
        api_client: kubernetes.client.ApiClient, core: kubernetes.client.CoreV1Api, namespace: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(RawListWatch, "watch", ExpiringOnce.watch)
    node = unique_name("cache-node")
    bound_pod(core, namespace, "before", node, None)
    pods = NodePods(api_client, node, trust=TEST_TRUST, retry_delay_s=0.1)
    pods.start()
    try:
        assert pods.wait_synced(30)
        bound_pod(core, namespace, "after-relist", node, None)
        bound_pod(core, namespace, "elsewhere", unique_name("other"), None)
        wait_until(lambda: {p.name for p in pods.snapshot()[1]} == {"before", "after-relist"},
                   what="the cache to see both pods", timeout_s=30)
        assert ExpiringOnce.expired == 1
        core.delete_namespaced_pod("before", namespace, grace_period_seconds=0)
        wait_until(lambda: {p.name for p in pods.snapshot()[1]} == {"after-relist"},
                   what="the cache to drop the deleted pod", timeout_s=30)
    finally:
        pods.stop()
