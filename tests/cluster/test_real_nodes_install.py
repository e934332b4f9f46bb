"""Real-node tier, three nodes installed from ``deploy/`` (issue 38): ``fastgshare cluster up
--from-manifests --nodes 3`` runs our components as pods and the node agent as a DaemonSet on
every node; ``deploy/install.sh`` with a new image tag rolls the agent on all three while tenants
run on all three, and none of them restarts or has a launch refused.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator

import kubernetes.client
import pytest

from fastgshare import keys
from fastgshare_cluster import manifests
from fastgshare_cluster.cluster import Cluster
from fastgshare_cluster.image_build import IMAGE
from fastgshare_cluster.processes import wait_until
from tests.cluster.conftest import local_cluster_for_tests
from tests.cluster.controlplane import Binaries
from tests.cluster.real_node import (  # noqa: F401 - fixtures
    apply,
    assert_tenants_never_failed,
    assignment_of,
    fastpod,
    log_lines,
    real_node_core,
    real_node_test_namespace,
    running_pods,
    share_annotations,
)

pytestmark = pytest.mark.realnode

NODES = 3
UPGRADE_IMAGE = "ghcr.io/fastgshare/fastgshare:0.1.1-upgrade"
AGENT = "fastgshare-node-agent"


@pytest.fixture(scope="module")
def real_cluster(cluster_binaries: Binaries, real_node_turn: None,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with local_cluster_for_tests(tmp_path_factory, nodes=NODES, from_manifests=True) as running:
        yield running


def agents(core: kubernetes.client.CoreV1Api) -> dict[str, kubernetes.client.V1Pod]:
    """Node -> its live node-agent pod."""
    pods = core.list_namespaced_pod(manifests.NAMESPACE, label_selector=f"app.kubernetes.io/name={AGENT}").items
    return {pod.spec.node_name: pod for pod in pods if pod.metadata.deletion_timestamp is None}


def ready(pod: kubernetes.client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def containerd_sockets(cluster: Cluster) -> list[str]:
    state = json.loads((cluster.state_dir / "cluster.json").read_text())
    return [state["containerd_socket"]] + [entry["containerd_socket"] for entry in state["nodes"][1:]]


def test_the_node_agent_daemonset_runs_on_every_node_with_its_gpus(real_cluster: Cluster,
                                                                   core: kubernetes.client.CoreV1Api) -> None:
    running = agents(core)
    assert sorted(running) == sorted(real_cluster.node_names)
    assert all(ready(pod) for pod in running.values())
    for name in real_cluster.node_names:
        node = core.read_node(name)
        assert int(node.status.allocatable[keys.VGPU_RESOURCE]) == 2 * keys.DEFAULT_SLOTS_PER_GPU
        assert len(json.loads(node.metadata.annotations[keys.NODE_GPU_INFO_ANNOTATION])["gpus"]) == 2


def test_an_upgrade_rolls_the_agent_on_every_node_while_tenants_run_on_all_of_them(
        real_cluster: Cluster, core: kubernetes.client.CoreV1Api, namespace: str) -> None:
    for name in real_cluster.node_names:
        tenant = fastpod(f"on-{name}", share_annotations(0.3, 0.5, 50, "512Mi"), {"TENANT_KERNEL_US": "2000"})
        tenant["spec"]["podSpec"]["nodeSelector"] = {"kubernetes.io/hostname": name}
        apply(real_cluster, namespace, tenant)
    pods = running_pods(core, namespace, NODES, timeout_s=120)
    assert sorted(assignment_of(pod).node_name for pod in pods) == sorted(real_cluster.node_names)
    before = {node: pod.metadata.uid for node, pod in agents(core).items()}
    launched = {pod.metadata.name: launches(real_cluster, namespace, pod.metadata.name) for pod in pods}
    ctr = shutil.which("ctr") or "ctr"
    for socket in containerd_sockets(real_cluster):  # what a pull of the new tag would leave on each node
        subprocess.run([ctr, "--address", socket, "--namespace", "k8s.io", "images", "tag", "--force", IMAGE,
                        UPGRADE_IMAGE], check=True, capture_output=True, timeout=60)
    started = time.monotonic()
    manifests.run_script("install.sh", real_cluster.kubeconfig, say=print,
                         log_path=real_cluster.state_dir / "logs" / "install.log",
                         env={"FASTGSHARE_IMAGE": UPGRADE_IMAGE, "FASTGSHARE_WAIT_TIMEOUT": "300s"})
    rolled = agents(core)
    assert sorted(rolled) == sorted(before)
    for node, pod in rolled.items():
        assert pod.metadata.uid != before[node], f"the agent on {node} was not replaced"
        assert pod.spec.containers[0].image == UPGRADE_IMAGE
        assert ready(pod)
    print(f"install.sh rolled the node agent on {len(rolled)} nodes in {time.monotonic() - started:.0f} s")
    wait_until(lambda: all(len(pod.status.container_statuses or []) and pod.status.container_statuses[0].ready
                           for pod in core.list_namespaced_pod(namespace).items),
               what="the tenants still running", timeout_s=30)
    wait_until(lambda: all(launches(real_cluster, namespace, name) > count for name, count in launched.items()),
               what="every tenant launching on the new agents", timeout_s=60)
    assert_tenants_never_failed(real_cluster, core, namespace)


def launches(cluster: Cluster, namespace: str, pod: str) -> int:
    """The launches the tenant's last report counts."""
    reports = [line for line in log_lines(cluster, namespace, pod) if line.get("event") == "report"]
    return int(reports[-1]["launches"]) if reports else 0
