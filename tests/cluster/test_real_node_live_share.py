"""Real-node tier: live share changes (issue 13, item 3).

A running tenant's time quota annotations are edited with ``kubectl annotate``; the extender
re-checks its GPU and rewrites its assignment, the node agent's arbiter applies the new share to
the running processes. The achieved share is the simulated GPU's busy-time accounting. A change
that does not fit is refused with an event and the share stays. A FaSTPod's time-only change
updates its pods in place (no new pod).
"""

from __future__ import annotations

import time

import kubernetes.client
import pytest

from fastgshare import keys
from fastgshare_cluster.cluster import Cluster
from fastgshare_cluster.processes import wait_until
from tests.cluster.real_node import (  # noqa: F401 - fixtures
    apply,
    assignment_of,
    busy_by_pod,
    fastpod,
    gpu_pod,
    kubectl,
    measure_shares,
    real_node_core,
    real_node_test_namespace,
    running_pods,
    share_annotations,
    tenant_container,
)

pytestmark = pytest.mark.realnode

TENANT = {"TENANT_KERNEL_US": "2000", "TENANT_MEMORY": "64Mi"}
SAMPLE_S = 0.05
WINDOW_S = 0.4  # the achieved share is judged over sliding windows this long


def events_of(core: kubernetes.client.CoreV1Api, namespace: str, pod: str, reason: str) -> list[str]:
    return [e.message for e in core.list_namespaced_event(namespace).items
            if e.involved_object.name == pod and e.reason == reason]


def time_until_share_at_most(cluster: Cluster, gpu: str, uid: str, share: float, since: float,
                             timeout_s: float = 10) -> float:
    """Seconds from ``since`` until the pod's share over the last WINDOW_S is at most ``share``."""
    samples: list[tuple[float, int]] = []
    deadline = since + timeout_s
    while time.monotonic() < deadline:
        samples.append((time.monotonic(), busy_by_pod(cluster, gpu)[uid]))
        now, busy = samples[-1]
        old = next(((t, b) for t, b in reversed(samples) if now - t >= WINDOW_S), None)
        if old is not None and old[0] >= since and (busy - old[1]) / 1e9 / (now - old[0]) <= share:
            return now - since
        time.sleep(SAMPLE_S)
    raise AssertionError(f"the share of pod {uid} did not fall to {share} within {timeout_s}s")


def test_lowering_a_running_tenants_limit_takes_effect_within_two_seconds(
        real_cluster: Cluster, core: kubernetes.client.CoreV1Api, namespace: str) -> None:
    apply(real_cluster, namespace, gpu_pod("tenant", share_annotations(0.3, 0.6, 100, "256Mi"),
                                           tenant_container(TENANT)))
    pod, = running_pods(core, namespace, 1)
    gpu = assignment_of(pod).gpu_uuid
    time.sleep(1)
    before = measure_shares(real_cluster, [gpu], 2)[pod.metadata.uid]
    assert 0.5 <= before <= 0.63, before

    started = time.monotonic()
    kubectl(real_cluster, "annotate", "--overwrite", "-n", namespace, "pod/tenant", f"{keys.GPU_QUOTA_LIMIT}=0.3")
    wait_until(lambda: assignment_of(core.read_namespaced_pod("tenant", namespace)).share.limit_permille == 300,
               what="the new assignment", timeout_s=10, interval_s=0.02)
    assigned = time.monotonic() - started
    followed = time_until_share_at_most(real_cluster, gpu, pod.metadata.uid, 0.35, started)
    after = measure_shares(real_cluster, [gpu], 2)[pod.metadata.uid]
    print(f"live share change: limit 0.6 -> 0.3; assignment rewritten {assigned:.2f}s after kubectl annotate, "
          f"achieved share (over {WINDOW_S}s windows) at most 0.35 after {followed:.2f}s; share before "
          f"{before:.3f}, after {after:.3f}")
    assert followed <= 2.0
    assert 0.25 <= after <= 0.33, after
    changed = events_of(core, namespace, "tenant", "ShareChanged")
    assert changed, "no ShareChanged event on the pod"
    assert "to request 0.3 limit 0.3" in changed[0]
    current = core.read_namespaced_pod("tenant", namespace)
    assert all(status.restart_count == 0 for status in current.status.container_statuses)


def test_a_request_past_what_the_gpu_has_is_refused_with_an_event_and_the_share_stays(
        real_cluster: Cluster, core: kubernetes.client.CoreV1Api, namespace: str) -> None:
    apply(real_cluster, namespace, gpu_pod("tenant", share_annotations(0.3, 0.4, 100, "256Mi"),
                                           tenant_container(TENANT)))
    running_pods(core, namespace, 1)
    apply(real_cluster, namespace, gpu_pod("neighbour", share_annotations(0.5, 0.5, 100, "256Mi"),
                                           tenant_container(TENANT)))
    pods = {p.metadata.name: p for p in running_pods(core, namespace, 2)}
    gpu = assignment_of(pods["tenant"]).gpu_uuid
    assert assignment_of(pods["neighbour"]).gpu_uuid == gpu, "binpack put the two pods on different GPUs"
    uid = pods["tenant"].metadata.uid
    time.sleep(1)
    before = measure_shares(real_cluster, [gpu], 2)[uid]

    kubectl(real_cluster, "annotate", "--overwrite", "-n", namespace, "pod/tenant",
            f"{keys.GPU_QUOTA_REQUEST}=0.8", f"{keys.GPU_QUOTA_LIMIT}=0.9")
    wait_until(lambda: events_of(core, namespace, "tenant", "ShareChangeRefused"), what="a ShareChangeRefused event",
               timeout_s=10, interval_s=0.05)
    refused, = events_of(core, namespace, "tenant", "ShareChangeRefused")
    after = measure_shares(real_cluster, [gpu], 2)[uid]
    print(f"refused share change: {refused}; share before {before:.3f}, after {after:.3f}")
    assert f"{keys.GPU_QUOTA_REQUEST} 0.8 does not fit GPU" in refused
    assert "at most 0.5 of the time is free" in refused
    share = assignment_of(core.read_namespaced_pod("tenant", namespace)).share
    assert (share.request_permille, share.limit_permille) == (300, 400)
    assert before <= 0.43, before
    assert after <= 0.43, after
    assert abs(after - before) <= 0.05, (before, after)
    time.sleep(1)  # later pod events do not repeat the refusal
    assert len(events_of(core, namespace, "tenant", "ShareChangeRefused")) == 1


def test_a_fastpods_time_quota_change_updates_its_running_pod_in_place(
        real_cluster: Cluster, core: kubernetes.client.CoreV1Api, namespace: str) -> None:
    apply(real_cluster, namespace, fastpod("fn", share_annotations(0.3, 0.6, 100, "256Mi"), TENANT))
    pod, = running_pods(core, namespace, 1)
    gpu = assignment_of(pod).gpu_uuid
    started = time.monotonic()
    kubectl(real_cluster, "annotate", "--overwrite", "-n", namespace, "fastpod/fn", f"{keys.GPU_QUOTA_LIMIT}=0.3")
    wait_until(lambda: assignment_of(core.read_namespaced_pod(pod.metadata.name, namespace)).share.limit_permille
               == 300, what="the pod's new assignment", timeout_s=10, interval_s=0.02)
    assigned = time.monotonic() - started
    followed = time_until_share_at_most(real_cluster, gpu, pod.metadata.uid, 0.35, started)
    print(f"FaSTPod limit 0.6 -> 0.3: pod assignment rewritten after {assigned:.2f}s, share followed after "
          f"{followed:.2f}s")
    now, = core.list_namespaced_pod(namespace).items
    assert now.metadata.uid == pod.metadata.uid  # the same pod: updated in place, not rolled
    assert now.status.container_statuses[0].restart_count == 0
    assert followed <= 2.0
