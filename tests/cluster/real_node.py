"""Helpers of the real-node tier: manifests of tenant pods, ``kubectl`` against the local
cluster, and the share of GPU time each pod got, measured by the simulated GPU itself
(:mod:`fastgshare_cli.pod_shares`, what ``fastgshare cluster shares`` shows).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from fastgshare import keys
from fastgshare.codec import PodAssignment, decode_assignment
from fastgshare_cli import pod_shares
from fastgshare_cli.pod_shares import use_by_pod
from fastgshare_cluster import cluster as local_cluster
from fastgshare_cluster import identities
from fastgshare_cluster.cluster import Cluster
from fastgshare_cluster.controlplane import write_kubeconfig
from fastgshare_cluster.images import FAKE_FN_IMAGE_SHORT, TENANT_IMAGE_SHORT
from fastgshare_kube import rest
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


def fake_fn_pod_spec(env: Mapping[str, str]) -> dict[str, Any]:
    """A function's pod spec: the fake-fn image on the function port, Ready once ``/_/health``
    answers (after its model is loaded or mapped), with ``env`` (FAKE_FN_* settings)."""
    return {"terminationGracePeriodSeconds": 1, "containers": [{
        "name": "fn", "image": FAKE_FN_IMAGE_SHORT, "imagePullPolicy": "IfNotPresent",
        "ports": [{"containerPort": keys.FUNCTION_PORT}],
        "readinessProbe": {"httpGet": {"path": "/_/health", "port": keys.FUNCTION_PORT}, "periodSeconds": 1},
        "env": [{"name": name, "value": value} for name, value in env.items()]}]}


def fastpod(name: str, annotations: Mapping[str, str], env: Mapping[str, str], replicas: int = 1) -> dict[str, Any]:
    return {"apiVersion": keys.FASTPOD_API_VERSION, "kind": keys.FASTPOD_KIND,
            "metadata": {"name": name, "annotations": dict(annotations)},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "podSpec": {"terminationGracePeriodSeconds": 1, "containers": [tenant_container(env)]}}}


def gpu_pod(name: str, annotations: Mapping[str, str], container: dict[str, Any]) -> dict[str, Any]:
    """A plain Pod asking our scheduler for one vGPU with the given share."""
    container = {**container, "resources": {"limits": {keys.VGPU_RESOURCE: "1"}}}
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
        seen = [describe_pod(p) for p in core.list_namespaced_pod(namespace).items]
        events = [f"{e.involved_object.name}: {e.reason}: {e.message}"
                  for e in core.list_namespaced_event(namespace).items][-30:]
        raise TimeoutError(f"{error}; pods: {seen or 'none'}; events: {events or 'none'}") from None
    return pods_now()


def describe_pod(pod: kubernetes.client.V1Pod) -> str:
    """One line saying where a pod is stuck: phase, reason, node, unmet conditions, waiting containers."""
    status = pod.status
    parts = [f"{pod.metadata.name}: {status.phase}", status.reason or "", f"node={pod.spec.node_name or '-'}"]
    parts += [f"{c.type}={c.status}({c.reason or ''}: {c.message or ''})"
              for c in status.conditions or [] if c.status != "True"]
    parts += [f"{c.name} waiting {c.state.waiting.reason}: {c.state.waiting.message or ''}"
              for c in status.container_statuses or [] if c.state.waiting]
    return " ".join(part for part in parts if part)


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


@pytest.fixture(name="core")
def real_node_core(real_cluster: Cluster) -> kubernetes.client.CoreV1Api:
    """The real node's API as ``core`` (import this fixture into a real-node test module)."""
    return kubernetes.client.CoreV1Api(real_cluster.api_client())


@pytest.fixture(name="namespace")
def real_node_test_namespace(real_cluster: Cluster, core: kubernetes.client.CoreV1Api,
                             request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace named after the test (parametrized cases differ), emptied afterwards as
    :func:`real_node_namespace` does (import this fixture into a real-node test module)."""
    base = request.node.name.removeprefix("test_").replace("_", "-")
    name = f"{base[:40].rstrip('-')}-{zlib.crc32(base.encode()) % 100_000}"
    with real_node_namespace(real_cluster, core, name):
        yield name


@contextmanager
def real_node_namespace(cluster: Cluster, core: kubernetes.client.CoreV1Api, name: str) -> Iterator[str]:
    """A namespace for one test on the real node, emptied the way a user would empty it.

    Afterwards the FaSTPods go first (so their controller makes no replacements), then the pods
    with their own grace period, and the next test starts once the kubelet has finished every
    one of them. Force-deleting pods on a real kubelet is what this avoids: kubelet v1.20's device
    manager can crash when a pod is force-deleted while the next is admitted (kubernetes#103838,
    fixed in 1.24), and the FaSTPod controller admits a replacement at once. A component that
    exited during the test fails it with its log's last lines instead of stalling later tests.
    """
    core.create_namespace(kubernetes.client.V1Namespace(metadata=kubernetes.client.V1ObjectMeta(name=name)))
    yield name
    custom = kubernetes.client.CustomObjectsApi(core.api_client)
    custom.delete_collection_namespaced_custom_object(keys.FASTPOD_GROUP, keys.FASTPOD_VERSION, name,
                                                      keys.FASTPOD_PLURAL)
    core.delete_collection_namespaced_pod(name)
    deadline = time.monotonic() + 180  # 20 pods on a loaded 2-core machine take a while
    while (left := core.list_namespaced_pod(name).items) and time.monotonic() < deadline:
        time.sleep(0.2)
    uids = [pod.metadata.uid for pod in left]
    if left:  # the kubelet did not finish them: let the API forget them, and wait for the cgroups
        print(f"the kubelet did not finish {len(left)} pods of {name} within 180 s; deleting them at once")
        core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
        while any(pod_cgroup_exists(uid) for uid in uids) and time.monotonic() < deadline + 60:
            time.sleep(0.2)
    core.delete_namespace(name)
    exited = [c for c in local_cluster.status(cluster.state_dir) if not c.running]
    assert not exited, "\n".join(f"{c.name} exited during the test; the end of {c.log}:\n{_tail(c.log)}"
                                 for c in exited)


@contextmanager
def second_team(cluster: Cluster, core: kubernetes.client.CoreV1Api, name: str) -> Iterator[tuple[str, Path]]:
    """A second team as a user's cluster has one: namespace ``name`` (emptied afterwards as
    :func:`real_node_namespace` does), a ServiceAccount there bound to the standard ``edit``
    ClusterRole in that namespace only, and a kubeconfig that authenticates with its token (the
    token controller made it). Yields (namespace, kubeconfig)."""
    with real_node_namespace(cluster, core, name):
        core.create_namespaced_service_account(name, {"metadata": {"name": "team"}})
        rbac = kubernetes.client.RbacAuthorizationV1Api(core.api_client)
        rbac.create_namespaced_role_binding(name, {
            "metadata": {"name": "team-edit"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
            "subjects": [{"kind": "ServiceAccount", "name": "team", "namespace": name}]})
        plane = json.loads(Path(cluster.kubeconfig).read_text())["clusters"][0]["cluster"]
        token = identities.service_account_token(local_api(core), name, "team")
        path = cluster.state_dir / f"{name}.kubeconfig"
        write_kubeconfig(path, host=plane["server"], token=token, ca_cert=Path(plane["certificate-authority"]))
        try:
            yield name, path
        finally:
            path.unlink(missing_ok=True)


def gateway_credentials(core: kubernetes.client.CoreV1Api) -> tuple[str, str]:
    """(user, password) of the gateway, from the Secret ``basic-auth`` as faas-cli users read it."""
    data = core.read_namespaced_secret(keys.BASIC_AUTH_SECRET, keys.SYSTEM_NAMESPACE).data
    return (base64.b64decode(data[keys.BASIC_AUTH_USER_KEY]).decode(),
            base64.b64decode(data[keys.BASIC_AUTH_PASSWORD_KEY]).decode())


def local_api(core: kubernetes.client.CoreV1Api) -> Any:
    """The same API as ``core``, for :mod:`fastgshare_kube.rest` calls (dict answers)."""
    return rest.core_v1(core.api_client)


def _tail(path: str, lines: int = 30) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError as error:
        return f"(unreadable: {error})"


def pod_cgroup_exists(uid: str) -> bool:
    """Whether the kubelet still has the pod's cgroup (it removes it once the pod is torn down)."""
    while True:
        try:
            return any(Path("/sys/fs/cgroup/memory/kubepods").glob(f"**/pod{uid}"))
        except FileNotFoundError:  # a cgroup vanished while the walk listed it: walk again
            continue


def processes_of_pod(uid: str) -> dict[int, str]:
    """PID -> command name of each process on this machine whose cgroup names the pod."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if f"pod{uid}" in (entry / "cgroup").read_text():
                found[int(entry.name)] = (entry / "comm").read_text().strip()
        except OSError:  # the process ended while the walk read it
            continue
    return found


def metrics_reader_token(core: kubernetes.client.CoreV1Api, seconds: int = 600) -> str:
    """A token of ServiceAccount fastgshare-metrics-reader (deploy/monitoring/metrics-reader.yaml),
    which every component serves its /metrics to, as Prometheus's own account would be."""
    answer = rest.send(core.api_client, "POST", f"/api/v1/namespaces/{keys.SYSTEM_NAMESPACE}/serviceaccounts/"
                       f"{keys.METRICS_READER_SERVICE_ACCOUNT}/token",
                       {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                        "spec": {"expirationSeconds": seconds}})
    return str(answer["status"]["token"])


def node_metrics(cluster: Cluster, core: kubernetes.client.CoreV1Api) -> dict[tuple[str, frozenset[Any]], float]:
    """The node agent's /metrics, through the API server's node proxy as ``fastgshare inspect`` reads
    them (the metrics reader's token in the header the proxy keeps), parsed by prometheus-client:
    (sample name, labels) -> value."""
    node = core.read_node(cluster.node_name)
    port = node.metadata.annotations[keys.NODE_METRICS_PORT_ANNOTATION]
    text = rest.call_text(rest.core_v1(core.api_client).connect_get_node_proxy_with_path,
                          f"{cluster.node_name}:{port}", "metrics",
                          _headers={keys.METRICS_TOKEN_HEADER: f"Bearer {metrics_reader_token(core)}"})
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def log_lines(cluster: Cluster, namespace: str, pod: str) -> list[dict[str, Any]]:
    """The JSON lines the pod's container printed (``kubectl logs``)."""
    lines = []
    for line in kubectl(cluster, "logs", "-n", namespace, pod).splitlines():
        if line.startswith("{"):
            lines.append(json.loads(line))
    return lines


def assert_tenants_never_failed(cluster: Cluster, core: kubernetes.client.CoreV1Api, namespace: str) -> None:
    """No container of the namespace restarted, and each tenant's last report counts no refused launch."""
    for pod in core.list_namespaced_pod(namespace).items:
        assert all(status.restart_count == 0 for status in pod.status.container_statuses), pod.metadata.name
        reports = [line for line in log_lines(cluster, namespace, pod.metadata.name) if line.get("event") == "report"]
        assert reports, pod.metadata.name
        assert reports[-1]["errors"] == 0, (pod.metadata.name, reports[-1])  # no launch ever refused


def http(url: str, *, method: str = "GET", body: bytes | None = None,
         timeout_s: float = 30, auth: tuple[str, str] | None = None) -> tuple[int, bytes]:
    """One JSON request (with HTTP basic ``auth`` (user, password) if given); the status and the
    body, also for an HTTP error."""
    headers = {"Content-Type": "application/json"}
    if auth is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    request = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
