"""Helpers of the real-node tier: manifests of tenant pods, ``kubectl`` against the local
cluster, and the share of GPU time each pod got, measured by the simulated GPU itself
(:mod:`fastgshare_cli.pod_shares`, what ``fastgshare cluster shares`` shows).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import kubernetes.client
import yaml
from prometheus_client.parser import text_string_to_metric_families

from fastgshare import keys
from fastgshare.codec import PodAssignment, decode_assignment
from fastgshare_cli import pod_shares
from fastgshare_cli.pod_shares import use_by_pod
from fastgshare_cluster.cluster import Cluster
from fastgshare_cluster.images import TENANT_IMAGE_SHORT
from tests.cluster.controlplane import wait_until

_POD_UID = re.compile(r"/pod([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})(/|$)")


def share_annotations(request: float, limit: float, sm: int, memory: str) -> dict[str, str]:
    return {keys.GPU_QUOTA_REQUEST: str(request), keys.GPU_QUOTA_LIMIT: str(limit),
            keys.GPU_SM_PARTITION: str(sm), keys.GPU_MEM: memory}


def tenant_container(env: Mapping[str, str] | None = None, command: list[str] | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "tenant", "image": TENANT_IMAGE_SHORT, "imagePullPolicy": "IfNotPresent",
        "env": [{"name": name, "value": value} for name, value in (env or {}).items()],
    }
    if command:
        container["command"] = command
    return container


def fastpod(name: str, annotations: Mapping[str, str], env: Mapping[str, str], replicas: int = 1) -> dict[str, Any]:
    return {"apiVersion": keys.FASTPOD_API_VERSION, "kind": keys.FASTPOD_KIND,
            "metadata": {"name": name, "annotations": dict(annotations)},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "podSpec": {"terminationGracePeriodSeconds": 1, "containers": [tenant_container(env)]}}}


def gpu_pod(name: str, annotations: Mapping[str, str], container: dict[str, Any]) -> dict[str, Any]:
    """A plain Pod asking our scheduler for one vGPU with the given share."""
    container = {**container, "resources": {"limits": {keys.VGPU_RESOURCE: 1}}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": dict(annotations)},
            "spec": {"schedulerName": keys.SCHEDULER_NAME, "restartPolicy": "Never",
                     "terminationGracePeriodSeconds": 1, "containers": [container]}}


def kubectl(cluster: Cluster, *args: str, stdin: str | None = None) -> str:
    binary = shutil.which("kubectl")
    assert binary, "kubectl is not on PATH"
    result = subprocess.run([binary, f"--kubeconfig={cluster.kubeconfig}", *args], input=stdin, text=True,
                            capture_output=True, check=False, timeout=120)
    assert result.returncode == 0, f"kubectl {' '.join(args)} failed: {result.stderr}"
    return result.stdout


def inspect(cluster: Cluster, *args: str, via_kubectl: bool = False, seconds: float | None = None) -> str:
    """The output of ``fastgshare inspect ARGS`` (``kubectl fastgshare inspect ARGS``: the plugin found on
    PATH), with the cluster's kubeconfig in $KUBECONFIG; with ``seconds``, interrupted (Ctrl-C) after
    that long."""
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    command = ["kubectl", "fastgshare"] if via_kubectl else [sys.executable, "-m", "fastgshare_cli"]
    with subprocess.Popen([*command, "inspect", *args], env=env, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as process:
        try:
            output, errors = process.communicate(timeout=seconds if seconds is not None else 60)
        except subprocess.TimeoutExpired:
            if seconds is None:
                raise
            process.send_signal(signal.SIGINT)
            output, errors = process.communicate(timeout=30)
    assert process.returncode == 0, f"inspect {' '.join(args)} exited {process.returncode}: {errors}"
    return output


def node_metrics_address(cluster: Cluster, core: kubernetes.client.CoreV1Api) -> str:
    """host:port of the node agent's /metrics: the node's address and its fastgshare/metrics_port."""
    node = core.read_node(cluster.node_name)
    address = next(a.address for a in node.status.addresses if a.type == "InternalIP")
    return f"{address}:{node.metadata.annotations[keys.NODE_METRICS_PORT_ANNOTATION]}"


def apply(cluster: Cluster, namespace: str, *documents: Mapping[str, Any]) -> None:
    kubectl(cluster, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump_all(list(documents)))


ADMISSION_REJECTED = "UnexpectedAdmissionError"


def running_pods(core: kubernetes.client.CoreV1Api, namespace: str, count: int,
                 timeout_s: float = 90, *, ignore_rejected: bool = False) -> list[kubernetes.client.V1Pod]:
    """Wait until ``count`` pods of the namespace run (every container started); returns them. With
    ``ignore_rejected``, pods the kubelet refused at admission (``UnexpectedAdmissionError``: while a
    restarted kubelet waits for the device plugin to register again it has no vGPU to give) are not
    counted: the FaSTPod controller replaces them."""
    def pods_now() -> list[kubernetes.client.V1Pod]:
        pods = core.list_namespaced_pod(namespace).items
        return [p for p in pods if not (ignore_rejected and p.status.reason == ADMISSION_REJECTED)]

    def ready() -> bool:
        pods = pods_now()
        return len(pods) == count and all(
            p.status.phase == "Running" and bool(p.status.container_statuses)
            and all(c.state.running for c in p.status.container_statuses) for p in pods)

    try:
        wait_until(ready, what=f"{count} running pods in {namespace}", timeout_s=timeout_s)
    except TimeoutError as error:
        seen = [f"{p.metadata.name}: {p.status.phase} {p.status.reason or ''}".strip()
                for p in core.list_namespaced_pod(namespace).items]
        raise TimeoutError(f"{error}; pods: {seen or 'none'}") from None
    return pods_now()


def assignment_of(pod: kubernetes.client.V1Pod) -> PodAssignment:
    return decode_assignment(pod.metadata.annotations[keys.POD_ASSIGNMENT_ANNOTATION])


def busy_by_pod(cluster: Cluster, gpu_uuid: str) -> dict[str, int]:
    """Pod UID -> busy nanoseconds of its live processes on the simulated GPU."""
    return {uid: use.busy_ns for uid, use in use_by_pod(cluster.fake_gpu_dir(gpu_uuid)).items()}


def live_memory(cluster: Cluster, gpu_uuid: str) -> int:
    """Bytes the simulated GPU holds for live processes of pods."""
    return sum(use.memory_bytes for use in use_by_pod(cluster.fake_gpu_dir(gpu_uuid)).values())


def measure_shares(cluster: Cluster, gpus: Iterable[str], seconds: float) -> dict[str, float]:
    """Pod UID -> share of GPU time its processes got over the next ``seconds``, on ``gpus``."""
    return pod_shares.measure_shares((cluster.fake_gpu_dir(gpu) for gpu in gpus), seconds)


def pod_cgroup_exists(uid: str) -> bool:
    """Whether the kubelet still has the pod's cgroup (it removes it once the pod is torn down)."""
    while True:
        try:
            return any(Path("/sys/fs/cgroup/memory/kubepods").glob(f"**/pod{uid}"))
        except FileNotFoundError:  # a cgroup vanished while the walk listed it: walk again
            continue


def node_metrics(cluster: Cluster, core: kubernetes.client.CoreV1Api) -> dict[tuple[str, frozenset[Any]], float]:
    """The node agent's /metrics, through the API server's node proxy, parsed by prometheus-client:
    (sample name, labels) -> value."""
    node = core.read_node(cluster.node_name)
    port = node.metadata.annotations[keys.NODE_METRICS_PORT_ANNOTATION]
    text = kubectl(cluster, "get", "--raw", f"/api/v1/nodes/{cluster.node_name}:{port}/proxy/metrics")
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def log_lines(cluster: Cluster, namespace: str, pod: str) -> list[dict[str, Any]]:
    """The JSON lines the pod's container printed (``kubectl logs``)."""
    lines = []
    for line in kubectl(cluster, "logs", "-n", namespace, pod).splitlines():
        if line.startswith("{"):
            lines.append(json.loads(line))
    return lines
