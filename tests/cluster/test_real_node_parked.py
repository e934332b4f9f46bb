"""Real-node tier: parked pods (issue 39). A FaSTFunc of policy rpr with ``minReplicas: 0`` and
``parked: 1`` whose fake-fn takes 3 s to load its "model": once idle, its pod is parked in place (time
quota 0/0 in its signed assignment, memory held, the same pod); a request through the gateway is
answered by that pod, woken in place (no new pod, no model load), and the pod is parked again after
the scale-down delay. The first-response latency is printed, not asserted (``bench/parked.py``
measures it over 20 episodes)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pytest

from fastgshare import keys
from fastgshare.codec import decode_assignment
from fastgshare.profile import Profile, Slo
from fastgshare_cluster.cluster import Cluster
from fastgshare_cluster.processes import wait_until
from tests.cluster.real_node import http, inspect, real_node_core  # noqa: F401 - the fixture core
from tests.cluster.test_real_node_autoscale import autoscaled_function, point, status_of

pytestmark = pytest.mark.realnode

NAMESPACE = keys.DEFAULT_FUNCTION_NAMESPACE
FUNCTION = "parked"
DELAY_S = 3


@pytest.fixture
def parked_function(real_cluster: Cluster, core: kubernetes.client.CoreV1Api) -> Iterator[str]:
    profile = Profile(function=FUNCTION, slo=Slo(percentile=95, latency_ms=500), points=(point(0.4, 40, 50, 120),))
    with autoscaled_function(real_cluster, core, FUNCTION, profile, {
            "minReplicas": 0, "maxReplicas": 2, "parked": 1, "intervalSeconds": 1,
            "scaleDownDelaySeconds": DELAY_S}, env={"FAKE_FN_LOAD_MS": "3000", "FAKE_FN_GPU_MS": "2"}) as name:
        yield name


def live_pods(core: kubernetes.client.CoreV1Api) -> list[Any]:
    return [pod for pod in core.list_namespaced_pod(NAMESPACE, label_selector=f"{keys.FUNCTION_LABEL}={FUNCTION}")
            .items if pod.metadata.deletion_timestamp is None]


def assigned_limit(pod: Any) -> int | None:
    text = (pod.metadata.annotations or {}).get(keys.POD_ASSIGNMENT_ANNOTATION)
    return None if text is None else decode_assignment(text).share.limit_permille


def parked_pod(core: kubernetes.client.CoreV1Api) -> Any:
    """The function's one pod once it is parked on the node (its signed assignment gives no time) and ready."""
    found: list[Any] = []

    def parked() -> bool:
        pods = live_pods(core)
        ready = len(pods) == 1 and any(c.type == "Ready" and c.status == "True"
                                       for c in pods[0].status.conditions or [])
        if ready and assigned_limit(pods[0]) == 0:
            found[:] = pods
            return True
        return False

    wait_until(parked, what="the function's pod parked (assignment limit 0) and ready", timeout_s=180)
    return found[0]


def test_an_idle_function_parks_its_pod_and_a_request_wakes_the_same_pod_in_place(
        real_cluster: Cluster, core: kubernetes.client.CoreV1Api, parked_function: str) -> None:
    first = parked_pod(core)  # a new function starts parked: 3 s of model load before it is ready
    status = status_of(real_cluster, FUNCTION)
    assert (status.get("replicas"), status.get("parkedReplicas")) == (0, 1)
    assert status["parked"]["memoryBytes"] == 128 << 20
    assert status["parked"]["wakeQuotaRequest"] == "0.4"
    shown = inspect(real_cluster, "-n", NAMESPACE)
    assert "parked: 1 pods with no GPU time (time quota 0/0) hold 128 MiB of GPU memory" in shown, shown

    latencies = []
    for episode in range(2):
        pod = parked_pod(core)
        assert pod.metadata.uid == first.metadata.uid  # parked in place: the same pod, its model loaded
        started = time.monotonic()
        code, body = http(f"{real_cluster.gateway_url}/function/{FUNCTION}", method="POST", body=b"x")
        latencies.append((time.monotonic() - started) * 1000)
        assert code == 200, body
        pods = live_pods(core)
        assert [p.metadata.uid for p in pods] == [first.metadata.uid], "a new pod was started"
        assert assigned_limit(pods[0]) == 400  # woken to the configuration's share
        wait_until(lambda: status_of(real_cluster, FUNCTION).get("parkedReplicas") == 0,
                   what="the controller to count the woken pod as running", timeout_s=30)
        print(f"episode {episode}: first response from parked in {latencies[-1]:.0f} ms")
    parked_pod(core)  # parked again after the delay
    assert [p.metadata.uid for p in live_pods(core)] == [first.metadata.uid]
