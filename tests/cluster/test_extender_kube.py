"""The extender's kube adapter against the real API server: bind's calls and the watch-fed cache."""

from __future__ import annotations

from collections.abc import Iterator

import kubernetes.client
import pytest

from fastgshare import keys
from fastgshare.codec import PodAssignment, encode_assignment
from scheduler_extender.kube import ClusterWatch, KubeApi
from scheduler_extender.ports import ApiConflict
from scheduler_extender.state import ClusterState
from tests.builders import TEST_TRUST, make_share, share_annotations, signed_annotations
from tests.cluster.conftest import MakeGpuNode
from tests.cluster.controlplane import wait_until


def plain_pod(name: str, annotations: dict[str, str] | None = None) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": annotations or share_annotations()},
            "spec": {"containers": [{"name": "main", "image": "registry.invalid/none:0"}],
                     "schedulerName": "nobody-schedules-this"}}


def test_bind_calls(api_client: kubernetes.client.ApiClient, core: kubernetes.client.CoreV1Api, namespace: str,
                    make_gpu_node: MakeGpuNode) -> None:
    node = make_gpu_node(1).metadata.name
    kube = KubeApi(api_client)
    assert kube.read_pod(namespace, "absent") is None
    core.create_namespaced_pod(namespace, plain_pod("p"))
    pod = kube.read_pod(namespace, "p")
    assert pod is not None
    assert pod.annotations[keys.GPU_QUOTA_REQUEST] == "0.4"

    patched = kube.patch_pod_annotation(pod, keys.POD_ASSIGNMENT_ANNOTATION, "x")
    assert patched.annotations[keys.POD_ASSIGNMENT_ANNOTATION] == "x"
    assert patched.resource_version != pod.resource_version
    with pytest.raises(ApiConflict):  # the resourceVersion guard
        kube.patch_pod_annotation(pod, keys.POD_ASSIGNMENT_ANNOTATION, "y")
    removed = kube.patch_pod_annotation(patched, keys.POD_ASSIGNMENT_ANNOTATION, None)
    assert keys.POD_ASSIGNMENT_ANNOTATION not in removed.annotations

    # One write binds and annotates (issue 18); the Binding names the pod's uid and resourceVersion
    # (preconditions from 1.23 on, accepted and ignored before).
    kube.create_binding(removed, node, {keys.POD_ASSIGNMENT_ANNOTATION: "z"})
    bound = core.read_namespaced_pod("p", namespace)
    assert bound.spec.node_name == node
    assert bound.metadata.annotations[keys.POD_ASSIGNMENT_ANNOTATION] == "z"
    assert bound.metadata.annotations[keys.GPU_QUOTA_REQUEST] == "0.4"  # merged into the pod's, not replacing them
    with pytest.raises(ApiConflict):  # bound already
        kube.create_binding(removed, node, {keys.POD_ASSIGNMENT_ANNOTATION: "other"})
    assert core.read_namespaced_pod("p", namespace).metadata.annotations[keys.POD_ASSIGNMENT_ANNOTATION] == "z"


@pytest.fixture
def watched_state(api_client: kubernetes.client.ApiClient) -> Iterator[ClusterState]:
    state = ClusterState(bind_wait_s=0, trust=TEST_TRUST)
    watch = ClusterWatch(api_client, state)
    watch.start()
    try:
        assert state.wait_synced(60)
        yield state
    finally:
        watch.stop()


def held_on(state: ClusterState, node: str) -> list[str]:
    entry = state.snapshot().nodes.get(node)
    if entry is None or entry.state is None:
        return []
    return sorted(placement.pod_key for placement in state.snapshot().placements if placement.node == node)


def test_watch_counts_assigned_pods_and_frees_deleted_ones(
        watched_state: ClusterState, core: kubernetes.client.CoreV1Api, namespace: str,
        make_gpu_node: MakeGpuNode) -> None:
    node = make_gpu_node(1).metadata.name
    wait_until(lambda: node in watched_state.snapshot().nodes, what="the node in the cache", timeout_s=30)
    assignment = PodAssignment(node_name=node, gpu_uuid=f"GPU-{node}-0", gpu_index=0, share=make_share(),
                               assigned_at_ms=1)
    # The assignment unsigned, as anyone who may create a pod can write it: not counted (the cache
    # sees it before the signed one below, so the wait for that one shows it was passed over).
    core.create_namespaced_pod(namespace, plain_pod("forged", {**share_annotations(),
                                                               keys.POD_ASSIGNMENT_ANNOTATION:
                                                                   encode_assignment(assignment)}))
    core.create_namespaced_pod(namespace, plain_pod("unassigned"))
    # Signed for the pod's uid, as the extender writes it (a bind in flight: not bound yet).
    uid = core.create_namespaced_pod(namespace, plain_pod("assigned")).metadata.uid
    core.patch_namespaced_pod("assigned", namespace, {"metadata": {"annotations": signed_annotations(uid, assignment)}})
    wait_until(lambda: held_on(watched_state, node) == [f"{namespace}/assigned"], what="the pod counted",
               timeout_s=30)
    core.delete_namespaced_pod("assigned", namespace, grace_period_seconds=0)
    wait_until(lambda: held_on(watched_state, node) == [], what="the pod's share freed", timeout_s=30)
    core.delete_node(node)
    wait_until(lambda: node not in watched_state.snapshot().nodes, what="the node gone", timeout_s=30)
