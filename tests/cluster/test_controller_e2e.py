"""End to end: FaSTPod → controller → pods → real kube-scheduler → extender → bound pods with GPUs.

The controller runs in-process as in ``test_controller``; the extender as its command, the
scheduler with the shipped v1beta1 profile, and a stand-in for the node agents marks bound pods
allocated (see ``tests/integration/scheduler_extender/harness.py``). Two fake nodes of two GPUs,
tainted for this test: pods of earlier tests may still be pending in namespaces being deleted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import kubernetes.client
import pytest

from fastgshare import keys
from fastgshare.codec import PodAssignment, decode_assignment
from fastgshare.share import parse_share
from tests.builders import signed_annotations
from tests.cluster.conftest import MakeGpuNode, StartScheduler
from tests.cluster.controlplane import ControlPlane, free_ports, wait_until
from tests.cluster.test_controller import Cluster, fastpod_body, install_fastpod_crd, running_controller
from tests.integration.scheduler_extender.harness import AllocationMarker, ExtenderProcess, get_json, scheduler_config

TAINT = {"key": "fastgshare.test/e2e", "value": "controller", "effect": "NoSchedule"}
SMALL = {keys.GPU_QUOTA_REQUEST: "0.3", keys.GPU_QUOTA_LIMIT: "0.3", keys.GPU_SM_PARTITION: "40",
         keys.GPU_MEM: "1Gi"}  # six fit on one GPU (3 x 2 rectangles of 300 x 40)


@pytest.fixture
def extender(control_plane: ControlPlane, tmp_path: Path) -> Iterator[ExtenderProcess]:
    (port,) = free_ports(1)
    process = ExtenderProcess(control_plane.kubeconfig, port, tmp_path / "extender.log", bind_wait_s=2.0)
    process.start()
    yield process
    process.stop()


def reserved_node(cluster: Cluster, make_gpu_node: MakeGpuNode) -> str:
    """A fake node of two GPUs, tainted so that pods other tests left pending cannot land on it."""
    name: str = make_gpu_node(2, labels={TAINT["key"]: TAINT["value"]}).metadata.name
    cluster.core.patch_node(name, {"spec": {"taints": [TAINT]}})
    return name


def e2e_fastpod(name: str, annotations: dict[str, str]) -> dict[str, object]:
    """Four replicas that tolerate the taint and select the reserved nodes (the podSpec says so)."""
    body = fastpod_body(name, replicas=4, annotations=annotations)
    body["spec"]["podSpec"].update(
        tolerations=[{**TAINT, "operator": "Equal"}], nodeSelector={TAINT["key"]: TAINT["value"]})
    return body


def resident_pod(cluster: Cluster, node: str) -> str:
    """A pod already running on ``node``'s first GPU, so the nodes differ for the policies: an
    empty cluster makes ties, which kube-scheduler breaks at random. Its assignment is signed for
    its uid with the test key :class:`ExtenderProcess` gives the extender (an unsigned one would not count)."""
    gpu = f"GPU-{node}-0"
    assignment = PodAssignment(node_name=node, gpu_uuid=gpu, gpu_index=0, share=parse_share(SMALL), assigned_at_ms=1)
    created = cluster.core.create_namespaced_pod(cluster.namespace, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "resident", "annotations": SMALL},
        "spec": {"nodeName": node, "schedulerName": keys.SCHEDULER_NAME, "containers": [
            {"name": "main", "image": "registry.invalid/none:0", "resources": {"limits": {keys.VGPU_RESOURCE: "1"}}}]},
    })
    cluster.core.patch_namespaced_pod("resident", cluster.namespace, {"metadata": {
        "annotations": signed_annotations(created.metadata.uid, assignment)}})
    return gpu


def placements(cluster: Cluster, fastpod: str) -> list[tuple[str, str]]:
    """(node, GPU uuid) of every bound pod of ``fastpod``, checked against its assignment."""
    found = []
    for pod in cluster.pods(fastpod):
        if not pod.spec.node_name:
            continue
        assignment = decode_assignment(pod.metadata.annotations[keys.POD_ASSIGNMENT_ANNOTATION])
        assert assignment.node_name == pod.spec.node_name
        assert (assignment.share.request_permille, assignment.share.sm_percent) == (300, 40)
        found.append((pod.spec.node_name, assignment.gpu_uuid))
    return found


@pytest.fixture
def cluster(api_client: kubernetes.client.ApiClient, namespace: str) -> Cluster:
    install_fastpod_crd(api_client)
    return Cluster(api_client, namespace)


def test_fastpods_of_four_end_bound_with_a_gpu_each_packed_or_spread(
        cluster: Cluster, control_plane: ControlPlane, make_gpu_node: MakeGpuNode, start_scheduler: StartScheduler,
        extender: ExtenderProcess) -> None:
    namespace = cluster.namespace
    busy, idle = (reserved_node(cluster, make_gpu_node) for _ in range(2))
    busy_gpu = resident_pod(cluster, busy)

    def extender_counts_the_resident() -> bool:
        gpus = get_json(f"{extender.url}/inspect")["nodes"].get(busy, {}).get("gpus", [])
        return any(pod["pod"] == f"{namespace}/resident" for gpu in gpus for pod in gpu["pods"])

    wait_until(extender_counts_the_resident, what="the extender to count the resident pod", timeout_s=30)
    start_scheduler(scheduler_config(extender.url))
    with AllocationMarker(cluster.api, namespace), running_controller(control_plane, namespace, "--no-leader-elect"):
        cluster.create_fastpod(e2e_fastpod("packed", SMALL))
        wait_until(lambda: len(placements(cluster, "packed")) == 4, what="4 packed pods bound", timeout_s=180)
        packed = placements(cluster, "packed")
        assert set(packed) == {(busy, busy_gpu)}, f"binpack fills the busy GPU: {packed}"

        spread_share = {**SMALL, keys.SCHEDULING_POLICY_ANNOTATION: "spread"}
        cluster.create_fastpod(e2e_fastpod("spread", spread_share))
        wait_until(lambda: len(placements(cluster, "spread")) == 4, what="4 spread pods bound", timeout_s=180)
        spread = placements(cluster, "spread")
        assert (busy, busy_gpu) not in spread, f"spread avoids the full GPU, which has room for one: {spread}"
        assert len(Counter(spread)) >= 2, f"spread uses the empty GPUs: {spread}"
        assert {node for node, _ in spread} <= {busy, idle}

        status = cluster.wait_for_status(
            "spread", lambda s: all("gpu" in p for p in s.get("pods", [])) and len(s.get("pods", [])) == 4,
            "every pod's GPU in the status")
        assert sorted((p["node"], p["gpu"]) for p in status["pods"]) == sorted(spread)
