"""The controller as a process (``python -m fastpod_crd_controller``): leader election between two
replicas, a clean SIGTERM that hands over at once, and a crash mid-way that leaves no duplicates.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from fastgshare import keys
from tests.cluster.controlplane import ControlPlane, ManagedProcess, ProcessSet, wait_until
from tests.cluster.test_controller import Cluster, fastpod_body, install_fastpod_crd

StartController = Callable[..., ManagedProcess]


@pytest.fixture
def cluster(api_client: kubernetes.client.ApiClient, namespace: str) -> Cluster:
    install_fastpod_crd(api_client)
    return Cluster(api_client, namespace)


@pytest.fixture
def start_controller(control_plane: ControlPlane, namespace: str, tmp_path: Path) -> Iterator[StartController]:
    """Factory: a controller process watching the test's namespace, its Lease there too."""
    processes = ProcessSet()

    def start(identity: str, *flags: str) -> ManagedProcess:
        return processes.start(f"controller-{identity}", [
            sys.executable, "-m", "fastpod_crd_controller", "--kubeconfig", str(control_plane.kubeconfig),
            "--namespace", namespace, "--lease-namespace", namespace, "--identity", identity,
            "--lease-duration-seconds", "6", "--renew-deadline-seconds", "4", "--retry-period-seconds", "1",
            *flags], tmp_path / f"controller-{identity}.log")

    try:
        yield start
    finally:
        processes.stop_all()


def lease(cluster: Cluster) -> Any:
    return kubernetes.client.CoordinationV1Api(cluster.api).read_namespaced_lease("fastgshare-controller",
                                                                                  cluster.namespace)


def holder(cluster: Cluster) -> str | None:
    try:
        return str(lease(cluster).spec.holder_identity or "")
    except kubernetes.client.exceptions.ApiException:
        return None


def creators(cluster: Cluster, name: str) -> set[str]:
    """The controller instances that reported creating pods for FaSTPod ``name``."""
    return {event.reporting_instance for event in cluster.events(name, "SuccessfulCreate")}


def test_two_replicas_one_leader_and_a_clean_handover(cluster: Cluster, start_controller: StartController) -> None:
    first = start_controller("first")
    wait_until(lambda: holder(cluster) == "first", what="the first replica to lead", timeout_s=60, watched=first)
    second = start_controller("second")
    cluster.create_fastpod(fastpod_body("led", replicas=2))
    cluster.wait_for_pods("led", 2)
    wait_until(lambda: creators(cluster, "led") == {"first"}, what="the leader's events", timeout_s=30)
    second.check_running()
    assert holder(cluster) == "first"  # the standby waits

    first.stop()  # SIGTERM: finish, release the Lease, exit 0
    assert first.popen.returncode == 0, first.log_tail()
    assert "released leadership" in first.log_tail()
    wait_until(lambda: holder(cluster) == "second", what="the standby to take over", timeout_s=30, watched=second)
    cluster.scale("led", 3)
    cluster.wait_for_pods("led", 3)
    wait_until(lambda: "second" in creators(cluster, "led"), what="the new leader to act", timeout_s=30)
    assert lease(cluster).spec.lease_transitions == 1
    assert len(cluster.pods("led")) == 3


def test_a_leader_that_dies_is_replaced_after_the_lease_expires(cluster: Cluster,
                                                                 start_controller: StartController) -> None:
    first = start_controller("first")
    wait_until(lambda: holder(cluster) == "first", what="the first replica to lead", timeout_s=60, watched=first)
    second = start_controller("second")
    first.popen.send_signal(signal.SIGKILL)
    first.popen.wait(10)
    wait_until(lambda: holder(cluster) == "second", what="the standby to take over an expired lease",
               timeout_s=60, watched=second)


def test_a_crash_midway_leaves_no_duplicate_pods(cluster: Cluster, start_controller: StartController) -> None:
    replicas = 60
    cluster.create_fastpod(fastpod_body("crash", replicas=replicas))
    first = start_controller("first", "--no-leader-elect", "--workers", "1")
    wait_until(lambda: len(cluster.pods("crash")) >= 1, what="the first pods", timeout_s=60, watched=first,
               interval_s=0.02)
    first.popen.send_signal(signal.SIGKILL)
    first.popen.wait(10)
    midway = len(cluster.pods("crash"))
    second = start_controller("second", "--no-leader-elect")
    cluster.wait_for_pods("crash", replicas)
    cluster.wait_for_status("crash", lambda s: s.get("replicas") == replicas, f"{replicas} replicas")
    second.check_running()
    pods = cluster.core.list_namespaced_pod(cluster.namespace, label_selector=f"{keys.FASTPOD_NAME_LABEL}=crash")
    assert len(pods.items) == replicas
    assert midway < replicas, "the first controller finished before it was killed; the test proved nothing"
