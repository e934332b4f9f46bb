"""Real-node tier: the node agent restarts under running tenants (issue 13, items 1 and 5).

``fastgshare cluster restart node-agent`` (``cluster.restart``) stops the agent as a rolling
update would (SIGTERM) or, with ``kill``, as a crash would (SIGKILL), and starts it again; the
hooks in the tenants reconnect. Also: a tenant cannot remove or replace the arbiter's socket.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterator

import kubernetes.client
import pytest

from fastgshare_cli.pod_shares import use_by_pod
from fastgshare_cluster import cluster as local_cluster
from fastgshare_cluster.cluster import Cluster
from fastgshare_cluster.processes import wait_until
from tests.cluster.real_node import (
    apply,
    assignment_of,
    busy_by_pod,
    fastpod,
    gpu_pod,
    kubectl,
    log_lines,
    node_metrics,
    pod_cgroup_exists,
    running_pods,
    share_annotations,
    tenant_container,
)

pytestmark = pytest.mark.realnode

MiB = 1 << 20
SHARES = {"low": (0.2, 0.3), "mid": (0.3, 0.5), "high": (0.1, 0.6)}


@pytest.fixture
def core(real_node_turn: None, real_cluster: Cluster) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(real_cluster.api_client())


@pytest.fixture
def namespace(core: kubernetes.client.CoreV1Api, request: pytest.FixtureRequest) -> Iterator[str]:
    base = request.node.name.removeprefix("test_").replace("_", "-")
    name = f"{base[:40].rstrip('-')}-{zlib.crc32(base.encode()) % 100_000}"  # parametrized cases differ
    core.create_namespace(kubernetes.client.V1Namespace(metadata=kubernetes.client.V1ObjectMeta(name=name)))
    yield name
    uids = [pod.metadata.uid for pod in core.list_namespaced_pod(name).items]
    core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    core.delete_namespace(name)
    deadline = time.monotonic() + 60  # the next test waits for the kubelet to tear these down
    while any(pod_cgroup_exists(uid) for uid in uids) and time.monotonic() < deadline:
        time.sleep(0.2)


def agent_healthy(cluster: Cluster, core: kubernetes.client.CoreV1Api) -> bool:
    port = core.read_node(cluster.node_name).metadata.annotations.get("fastgshare/metrics_port")
    try:
        kubectl(cluster, "get", "--raw", f"/api/v1/nodes/{cluster.node_name}:{port}/proxy/healthz")
    except Exception:
        return False
    return True


def test_restarting_the_node_agent_five_times_keeps_tenants_running(
        real_cluster: Cluster, core: kubernetes.client.CoreV1Api, namespace: str) -> None:
    apply(real_cluster, namespace, *(fastpod(name, share_annotations(request, limit, 100, "512Mi"),
                                             {"TENANT_KERNEL_US": "2000", "TENANT_MEMORY": "256Mi"})
                                     for name, (request, limit) in SHARES.items()))
    pods = running_pods(core, namespace, 3)
    gpus = {assignment_of(pod).gpu_uuid for pod in pods}
    time.sleep(2)
    busy_before = {uid: ns for gpu in gpus for uid, ns in busy_by_pod(real_cluster, gpu).items()}
    started = time.monotonic()
    resumed = []
    for turn in range(5):
        time.sleep(2)
        local_cluster.restart(real_cluster.state_dir, "node-agent", kill=turn % 2 == 0, say=lambda _t: None,
                              die_with_parent=True)
        started_again = time.monotonic() - 0.5  # restart() returns 0.5 s after the new agent was started
        busy = {uid: ns for gpu in gpus for uid, ns in busy_by_pod(real_cluster, gpu).items()}

        def all_launching(busy: dict[str, int] = busy) -> bool:
            now = {uid: ns for gpu in gpus for uid, ns in busy_by_pod(real_cluster, gpu).items()}
            return all(now[pod.metadata.uid] > busy[pod.metadata.uid] for pod in pods)

        wait_until(all_launching, what="every tenant launching again", timeout_s=60, interval_s=0.02)
        resumed.append(time.monotonic() - started_again)
        wait_until(lambda: agent_healthy(real_cluster, core), what="the node agent's /healthz", timeout_s=60)
    time.sleep(3)
    elapsed = time.monotonic() - started
    busy_after = {uid: ns for gpu in gpus for uid, ns in busy_by_pod(real_cluster, gpu).items()}
    shares = {pod.metadata.name: (busy_after[pod.metadata.uid] - busy_before[pod.metadata.uid]) / 1e9 / elapsed
              for pod in pods}
    print(f"every tenant launching again {', '.join(f'{s:.2f}s' for s in resumed)} after the new agent was "
          f"started; shares over {elapsed:.0f}s with 5 restarts: {shares}")
    for pod in core.list_namespaced_pod(namespace).items:
        assert all(status.restart_count == 0 for status in pod.status.container_statuses), pod.metadata.name
        reports = [line for line in log_lines(real_cluster, namespace, pod.metadata.name)
                   if line.get("event") == "report"]
        assert reports, pod.metadata.name
        assert reports[-1]["errors"] == 0, (pod.metadata.name, reports[-1])  # no launch ever refused
    for pod in pods:
        request, limit = SHARES[pod.metadata.name.rsplit("-", 1)[0]]
        assert request - 0.03 <= shares[pod.metadata.name] <= limit + 0.03, shares
    # Memory: the arbiter's ledger and the simulated GPU agree, each tenant's 256 MiB counted once.
    metrics = node_metrics(real_cluster, core)
    charged = {dict(labels)["pod"]: value for (name, labels), value in metrics.items()
               if name == "fastgshare_pod_gpu_memory_used_bytes"}
    for pod in pods:
        assert charged[pod.metadata.name] == 256 * MiB, charged
    held = {uid: use.memory_bytes for gpu in gpus for uid, use in use_by_pod(real_cluster.fake_gpu_dir(gpu)).items()}
    assert sorted(held.values()) == [256 * MiB] * 3


def test_a_tenant_cannot_remove_or_replace_the_arbiter_socket(
        real_cluster: Cluster, core: kubernetes.client.CoreV1Api, namespace: str) -> None:
    script = ("rm /var/run/fastgshare/arbiter.sock 2>&1; echo rm=$?; "
              "mv /var/run/fastgshare/arbiter.sock /var/run/fastgshare/x 2>&1; echo mv=$?; "
              "touch /var/run/fastgshare/impostor.sock 2>&1; echo touch=$?; sleep 3600")
    apply(real_cluster, namespace, gpu_pod("intruder", share_annotations(0.1, 0.2, 50, "64Mi"),
                                           {**tenant_container(command=["/bin/sh", "-c", script]),
                                            "securityContext": {"runAsUser": 0}}))
    running_pods(core, namespace, 1)
    socket = real_cluster.node_agent_state_dir / "run" / "arbiter.sock"
    wait_until(lambda: "touch=" in kubectl(real_cluster, "logs", "-n", namespace, "intruder"),
               what="the intruder's attempts", timeout_s=30)
    output = kubectl(real_cluster, "logs", "-n", namespace, "intruder")
    for attempt in ("rm", "mv", "touch"):
        assert f"{attempt}=0" not in output, output
    assert "Read-only file system" in output, output
    assert socket.is_socket()
    assert agent_healthy(real_cluster, core)


@pytest.mark.parametrize("component", ["extender", "controller", "kubelet", "containerd"])
def test_a_crashed_component_comes_back_and_running_pods_keep_running(
        real_cluster: Cluster, core: kubernetes.client.CoreV1Api, namespace: str, component: str) -> None:
    apply(real_cluster, namespace, fastpod("before", share_annotations(0.2, 0.4, 50, "64Mi"), {}))
    [before] = running_pods(core, namespace, 1, ignore_rejected=True)  # the node may be settling from the last test
    restarted = local_cluster.restart(real_cluster.state_dir, component, kill=True, say=lambda _t: None,
                                      die_with_parent=True)
    assert restarted.running
    statuses = {c.name: c for c in local_cluster.status(real_cluster.state_dir)}
    assert statuses[restarted.name].pid == restarted.pid  # the state file follows the new process
    # The node serves new GPU pods again (scheduling, binding, kubelet, Allocate, containerd). A pod
    # the restarted kubelet admits before the node agent has registered again is refused
    # (UnexpectedAdmissionError, kubelet's behaviour) and replaced by the FaSTPod controller.
    apply(real_cluster, namespace, fastpod("after", share_annotations(0.2, 0.4, 50, "64Mi"), {}))
    pods = running_pods(core, namespace, 2, timeout_s=120, ignore_rejected=True)
    [still] = [pod for pod in pods if pod.metadata.uid == before.metadata.uid]
    assert all(status.restart_count == 0 for status in still.status.container_statuses)
    gpu = assignment_of(still).gpu_uuid
    wait_until(lambda: before.metadata.uid in busy_by_pod(real_cluster, gpu), what="the first pod launching",
               timeout_s=30)
