"""End to end with the opt-in kubelet tier: the REAL kubelet calls our node agent's Allocate.

The same path as ``test_e2e.py`` (FaSTPod → controller → kube-scheduler + extender → bound pods
with assignments), but on the kubelet tier's node: the node agent registers with the real
kubelet, the Node's vGPU capacity comes from kubelet, and kubelet's device manager admits the
bound pods by calling Allocate. What it received is read back from kubelet's own checkpoint
(each container's AllocateResponse). Pods never start (no CNI, no pause image) and the node
stays NotReady, so the pods tolerate the not-ready taint.
"""

from __future__ import annotations

import base64
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import kubernetes.client
import pytest

from device_plugin._api import deviceplugin_pb2 as api
from fastgshare import keys
from fastgshare.codec import decode_assignment
from tests.cluster.conftest import StartScheduler
from tests.cluster.controlplane import ControlPlane, free_ports, wait_until
from tests.cluster.kubelet import KubeletNode
from tests.cluster.test_controller import Cluster, fastpod_body, install_fastpod_crd
from tests.cluster.test_e2e import SHARE, ProcessGroup, command
from tests.integration.scheduler_extender.harness import ExtenderProcess, scheduler_config

pytestmark = pytest.mark.kubelet

NOT_READY = [{"key": "node.kubernetes.io/not-ready", "operator": "Exists"},
             {"key": "node.kubernetes.io/unreachable", "operator": "Exists"}]


@pytest.fixture
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="fgs-e2e-k-") as directory:
        yield Path(directory)


def checkpoint_envs(device_plugin_dir: Path) -> dict[str, dict[str, str]]:
    """Pod UID → the environment kubelet got from our Allocate, from kubelet's checkpoint."""
    path = device_plugin_dir / "kubelet_internal_checkpoint"
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    found = {}
    for entry in data.get("Data", {}).get("PodDeviceEntries") or []:
        if entry.get("ResourceName") != keys.VGPU_RESOURCE:
            continue
        response = api.ContainerAllocateResponse.FromString(base64.b64decode(entry["AllocResp"]))
        found[entry["PodUID"]] = dict(response.envs)
    return found


def test_the_real_kubelet_allocates_each_pod_its_assigned_gpu(
        kubelet_node: KubeletNode, control_plane: ControlPlane, api_client: kubernetes.client.ApiClient,
        namespace: str, start_scheduler: StartScheduler, workdir: Path) -> None:
    install_fastpod_crd(api_client)
    cluster = Cluster(api_client, namespace)
    node = kubelet_node.name
    wait_until(kubelet_node.kubelet_socket.is_socket, what="kubelet.sock", timeout_s=120, watched=kubelet_node.process)
    group = ProcessGroup(workdir)
    kubeconfig = str(control_plane.kubeconfig)
    (port,) = free_ports(1)
    extender = ExtenderProcess(control_plane.kubeconfig, port, workdir / "extender.log", bind_wait_s=10.0)
    try:
        group.start("node-agent", [command("fastgshare-node-agent"), "--node-name", node, "--kubeconfig", kubeconfig,
                                   "--device-plugin-dir", str(kubelet_node.device_plugin_dir),
                                   "--state-dir", str(workdir / "state"), "--fake-gpus", "2x16GiB:80sm",
                                   "--slots-per-gpu", "4", "--hook-library", "/bin/true"])

        def advertised() -> bool:
            status = cluster.core.read_node(node).status
            return (status.allocatable or {}).get(keys.VGPU_RESOURCE) == "8" and keys.NODE_GPU_INFO_ANNOTATION in (
                cluster.core.read_node(node).metadata.annotations or {})

        wait_until(advertised, what="the vGPU capacity from kubelet and our inventory", timeout_s=120)
        extender.start()
        start_scheduler(scheduler_config(extender.url))
        group.start("controller", [command("fastgshare-controller"), "--kubeconfig", kubeconfig,
                                   "--namespace", namespace, "--no-leader-elect"])
        body = fastpod_body("resnet", replicas=3, annotations=SHARE)
        body["spec"]["podSpec"].update(tolerations=NOT_READY, nodeSelector={"kubernetes.io/hostname": node})
        cluster.create_fastpod(body)

        def all_admitted() -> bool:
            pods = cluster.pods("resnet")
            envs = checkpoint_envs(kubelet_node.device_plugin_dir)
            return len(pods) == 3 and all(p.metadata.uid in envs for p in pods)

        wait_until(all_admitted, what="kubelet to allocate 3 pods through our plugin", timeout_s=300,
                   watched=kubelet_node.process)
        envs = checkpoint_envs(kubelet_node.device_plugin_dir)
        for pod in cluster.pods("resnet"):
            assignment = decode_assignment(pod.metadata.annotations[keys.POD_ASSIGNMENT_ANNOTATION])
            env = envs[pod.metadata.uid]
            assert env[keys.ENV_POD] == f"{namespace}/{pod.metadata.name}"
            assert env[keys.ENV_VISIBLE_DEVICES] == assignment.gpu_uuid
            assert assignment.node_name == node
    finally:
        group.stop_all()
        extender.stop()
