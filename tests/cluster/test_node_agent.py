"""The node agent against the real API server: Allocate finds the right pod, marks it, refuses when none.

The agent runs with its real adapters (the watch-fed pod cache and the writer), simulated
GPUs, and a fake kubelet on unix sockets driving the real gRPC edge. Pods are created bound
to the node with extender-style assignments, as the extender's bind leaves them.
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
from device_plugin.allocation import Allocator, HostPaths, PodRecord
from device_plugin.devices import DeviceState
from device_plugin.discovery import SimulatedGpus
from device_plugin.kube import KubeWriter, NodePods
from device_plugin.servicer import DevicePluginServicer
from fastgshare import keys
from fastgshare.codec import PodAssignment, decode_node_inventory, encode_assignment
from fastgshare.inventory import GpuDevice, parse_gpu_spec
from fastgshare_kube.rest import RawListWatch
from tests.builders import make_share
from tests.cluster.conftest import unique_name
from tests.cluster.controlplane import wait_until
from tests.fake_kubelet import FakeKubelet


@attrs.define
class AgentUnderTest:
    node: str
    gpus: tuple[GpuDevice, ...]
    pods: NodePods
    kubelet: FakeKubelet

    def allocate(self) -> api.AllocateResponse:
        with self.kubelet.plugin_channel(keys.DEVICE_PLUGIN_SOCKET) as channel:
            request = api.AllocateRequest(container_requests=[api.ContainerAllocateRequest(devices_ids=["x::0"])])
            return api_grpc.DevicePluginStub(channel).Allocate(request, timeout=30)


@pytest.fixture
def agent(api_client: kubernetes.client.ApiClient, core: kubernetes.client.CoreV1Api) -> Iterator[AgentUnderTest]:
    node = unique_name("agent-node")
    core.create_node(kubernetes.client.V1Node(metadata=kubernetes.client.V1ObjectMeta(
        name=node, annotations={"team.example/owner": "ml-platform"})))
    with tempfile.TemporaryDirectory(prefix="fgs-") as directory:
        plugin_dir = Path(directory) / "dp"
        plugin_dir.mkdir()
        kubelet = FakeKubelet(plugin_dir)
        kubelet.start()
        gpus = SimulatedGpus(parse_gpu_spec("4x16GiB:80sm"), node)
        pods, writer = NodePods(api_client, node), KubeWriter(api_client)
        devices = DeviceState(node, gpus.devices(), slots_per_gpu=8)
        allocator = Allocator(node, HostPaths(hook_library=f"{directory}/lib/hook.so", run_dir=f"{directory}/run",
                                              mps_pipe_dir="/tmp/nvidia-mps"))
        stopping = threading.Event()
        node_agent = NodeAgent(devices=devices, backend=gpus, publisher=writer, plugin_dir=plugin_dir,
                               stopping=stopping, retry_s=0.2,
                               make_servicer=lambda: DevicePluginServicer(devices, allocator, pods, writer,
                                                                          stopping=stopping, allocate_wait_s=5))
        pods.start()
        assert pods.wait_synced(30)
        node_agent.start()
        assert kubelet.wait_for_registrations(1)
        try:
            yield AgentUnderTest(node, gpus.devices(), pods, kubelet)
        finally:
            node_agent.stop()
            pods.stop()
            kubelet.stop()
            core.delete_node(node)


def bound_pod(core: kubernetes.client.CoreV1Api, namespace: str, name: str, node: str, gpu: GpuDevice | None,
              *, at_ms: int = 0) -> None:
    """A pod as the extender's bind leaves it: bound to ``node``, with its assignment."""
    annotations = {}
    if gpu is not None:
        assignment = PodAssignment(node_name=node, gpu_uuid=gpu.uuid, gpu_index=gpu.index,
                                   share=make_share(request=200, limit=500, sm=25), assigned_at_ms=at_ms)
        annotations[keys.POD_ASSIGNMENT_ANNOTATION] = encode_assignment(assignment)
    core.create_namespaced_pod(namespace, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"nodeName": node, "containers": [{
            "name": "main", "image": "registry.invalid/none:0",
            "resources": {"limits": {keys.VGPU_RESOURCE: "1"}}}]},
    })


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
                      name: str) -> Iterator[PodRecord]:
    """A pod bound to a fresh node, and its record as the node agent's synced cache sees it."""
    node = unique_name(f"{name}-node")
    bound_pod(core, namespace, name, node, None)
    pods = NodePods(api_client, node)
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


def test_deleting_a_refused_pod_deletes_that_pod_and_not_its_successor(
        api_client: kubernetes.client.ApiClient, core: kubernetes.client.CoreV1Api, namespace: str) -> None:
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    with cached_single_pod(api_client, core, namespace, "refused") as old:
        assert old.controller is None  # a bare pod: nobody would replace it
        core.delete_namespaced_pod("refused", namespace, grace_period_seconds=0)
        bound_pod(core, namespace, "refused", old.node_name, None)
        core.patch_namespaced_pod("refused", namespace, {"metadata": {"ownerReferences": [{
            "apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid, "controller": True}]}})
        writer = KubeWriter(api_client)
        assert not writer.delete_refused(old)  # the successor of the same name stays
        assert core.read_namespaced_pod("refused", namespace).metadata.deletion_timestamp is None
        [current] = cached(api_client, old.node_name)
        assert current.controller == "ConfigMap/owner"
        assert writer.delete_refused(current)
    # No kubelet runs on the node, so the pod waits there in its grace period, deleting.
    assert core.read_namespaced_pod("refused", namespace).metadata.deletion_timestamp is not None
    assert not writer.delete_refused(attrs.evolve(current, uid="uid-of-nobody"))


def cached(api_client: kubernetes.client.ApiClient, node: str) -> list[PodRecord]:
    """The pods a freshly synced cache of the node agent shows on ``node``."""
    pods = NodePods(api_client, node)
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
    pods = NodePods(api_client, node, retry_delay_s=0.1)
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
