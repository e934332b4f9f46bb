"""Real-node tier: the node agent restarts under running tenants (issue 13, items 1 and 5).

``fastgshare cluster restart node-agent`` (``cluster.restart``) stops the agent as a rolling
update would (SIGTERM) or, with ``kill``, as a crash would (SIGKILL), and starts it again; the
hooks in the tenants reconnect. Also: a tenant cannot remove or replace the arbiter's socket.
"""

from __future__ import annotations

import time
from collections import Counter

import kubernetes.client
import pytest

from fastgshare_cli.pod_shares import use_by_pod
from fastgshare_cluster import cluster as local_cluster
from fastgshare_cluster.cluster import Cluster
from fastgshare_cluster.processes import http_ok, wait_until
from scheduler_extender.config import DEFAULT_BIND_WAIT_S
from tests.cluster.real_node import (  # noqa: F401 - fixtures
    ADMISSION_REJECTED,
    apply,
    assert_tenants_never_failed,
    assignment_of,
    busy_by_pod,
    fastpod,
    gpu_pod,
    kubectl,
    log_lines,
    node_metrics,
    real_node_core,
    real_node_test_namespace,
    running_pods,
    share_annotations,
    tenant_container,
)

pytestmark = pytest.mark.realnode

MiB = 1 << 20
SHARES = {"low": (0.2, 0.3), "mid": (0.3, 0.5), "high": (0.1, 0.6)}


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
    assert_tenants_never_failed(real_cluster, core, namespace)
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


def test_pods_bound_without_bind_turns_get_their_own_assignment_or_are_refused(
        real_cluster: Cluster, core: kubernetes.client.CoreV1Api, namespace: str) -> None:
    """Issue 13, item 2: with the extender's per-node bind turn forced to time out, kubelet admits
    pods in whatever order it likes. Allocate serves a pod only when it is sure what that pod gets
    (or every waiting pod gets the same); otherwise it refuses, and the FaSTPod controller replaces
    the refused pod. In the end all 20 run, each with its own GPU and SM percentage."""
    show = ('echo "{\\"visible\\": \\"$NVIDIA_VISIBLE_DEVICES\\", '
            '\\"sm\\": \\"$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE\\"}"; exec sleep 3600')
    documents = []
    for name, sm in (("twenty", 20), ("thirty", 30)):
        document = fastpod(name, share_annotations(0.02, 0.05, sm, "128Mi"), {}, replicas=10)
        document["spec"]["podSpec"]["containers"][0]["command"] = ["sh", "-c", show]
        documents.append(document)
    local_cluster.restart(real_cluster.state_dir, "extender", say=lambda _t: None, die_with_parent=True,
                          extra_args=["--bind-wait-seconds", "0"])
    try:
        wait_until(lambda: http_ok(f"{real_cluster.extender_url}/readyz"), what="the extender ready",
                   timeout_s=60)
        apply(real_cluster, namespace, *documents)
        pods = running_pods(core, namespace, 20, timeout_s=300, ignore_rejected=True)
    finally:
        local_cluster.restart(real_cluster.state_dir, "extender", say=lambda _t: None, die_with_parent=True,
                              extra_args=["--bind-wait-seconds", str(DEFAULT_BIND_WAIT_S)])
        wait_until(lambda: http_ok(f"{real_cluster.extender_url}/readyz"), what="the extender ready",
                   timeout_s=60)
    for pod in pods:
        assignment = assignment_of(pod)
        (seen,) = log_lines(real_cluster, namespace, pod.metadata.name)
        assert seen == {"visible": assignment.gpu_uuid, "sm": str(assignment.share.sm_percent)}, pod.metadata.name
        assert assignment.share.sm_percent == (20 if pod.metadata.name.startswith("twenty") else 30)
    refused = [pod for pod in core.list_namespaced_pod(namespace).items if pod.status.reason == ADMISSION_REJECTED]
    for pod in refused:
        assert "refused rather than guess" in pod.status.message, (pod.metadata.name, pod.status.message)
    print(f"20 pods bound without bind turns: {len(refused)} refused at admission and replaced; every running "
          f"pod has its own GPU and SM percentage")


def test_kill_9_of_each_component_while_thirty_pods_are_created_loses_and_double_books_nothing(
        real_cluster: Cluster, core: kubernetes.client.CoreV1Api, namespace: str) -> None:
    """Issue 13: kill -9 the node agent, extender, controller, kubelet and containerd, one after the
    other, while a FaSTPod of 30 is being created. Afterwards: exactly 30 pods run (none lost, none
    twice), each container sees its own GPU and SM percentage, and no GPU holds more than it has."""
    show = ('echo "{\\"visible\\": \\"$NVIDIA_VISIBLE_DEVICES\\", '
            '\\"sm\\": \\"$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE\\"}"; exec sleep 3600')
    document = fastpod("thirty", share_annotations(0.03, 0.05, 10, "512Mi"), {}, replicas=30)
    document["spec"]["podSpec"]["containers"][0]["command"] = ["sh", "-c", show]
    apply(real_cluster, namespace, document)
    for component, created in (("node-agent", 2), ("extender", 6), ("controller", 10), ("kubelet", 16),
                               ("containerd", 22)):
        wait_until(lambda created=created: len(core.list_namespaced_pod(namespace).items) >= created,
                   what=f"{created} pods created", timeout_s=180)
        local_cluster.restart(real_cluster.state_dir, component, kill=True, say=lambda _t: None, die_with_parent=True)
    pods = running_pods(core, namespace, 30, timeout_s=420, ignore_rejected=True)
    assert len({pod.metadata.name for pod in pods}) == 30
    per_gpu: dict[str, list[int]] = {}
    for pod in pods:
        assignment = assignment_of(pod)
        (seen,) = log_lines(real_cluster, namespace, pod.metadata.name)
        assert seen == {"visible": assignment.gpu_uuid, "sm": str(assignment.share.sm_percent)}, pod.metadata.name
        used = per_gpu.setdefault(assignment.gpu_uuid, [0, 0])
        used[0] += assignment.share.request_permille
        used[1] += assignment.share.memory_bytes
    for gpu, (request_permille, memory) in per_gpu.items():
        assert request_permille <= 1000, (gpu, request_permille)
        assert memory <= 16 << 30, (gpu, memory)
    refused = [pod for pod in core.list_namespaced_pod(namespace).items if pod.status.reason == ADMISSION_REJECTED]
    reasons = Counter(str(pod.status.message).split(" desc = ")[-1][:90] for pod in refused)
    print(f"30 pods with kill -9 of five components: all running, {len(refused)} refused at admission and replaced "
          f"({dict(reasons)}); per GPU (request permille, memory bytes): {per_gpu}")
