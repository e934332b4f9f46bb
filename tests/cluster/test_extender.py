"""The extender with the real kube-scheduler v1.20 calling it over HTTP, against the real API server.

The extender runs as its real command (``python -m scheduler_extender``) on a loopback port;
the scheduler runs the shipped v1beta1 configuration (``deploy/scheduler/``) pointed at it.
No kubelet runs, so an :class:`AllocationMarker` thread in the test process stands in for the
node agents: it marks every bound pod that carries an assignment allocated, as Allocate
would. The extender's bind wait is short (2 s) in case the marker lags.
"""

from __future__ import annotations

import signal
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
import kubernetes.client
import pytest

from fastgshare import keys
from fastgshare.codec import PodAssignment, decode_assignment, decode_node_inventory
from fastgshare.ledger import GpuLedger, NodeState
from fastgshare.placement import Policy, evaluate_node, score_node
from fastgshare.share import ShareSpec, parse_share
from tests.builders import share_annotations, signed_annotations
from tests.cluster.conftest import MakeGpuNode, StartScheduler
from tests.cluster.controlplane import ControlPlane, free_ports, wait_until
from tests.cluster.gpu_nodes import fake_gpus
from tests.integration.scheduler_extender.harness import (
    AllocationMarker,
    ExtenderProcess,
    get_json,
    scheduler_config,
)

Core = kubernetes.client.CoreV1Api
StartExtender = Callable[..., ExtenderProcess]


@attrs.frozen
class Cluster:
    """What every test here uses: the API, its namespace, and starters for nodes, scheduler, extender."""

    core: Core
    namespace: str
    make_gpu_node: MakeGpuNode
    start_scheduler: StartScheduler
    start_extender: StartExtender

    def start(self, **extender: Any) -> ExtenderProcess:
        """The extender, then the scheduler with the shipped configuration pointed at it."""
        process = self.start_extender(**extender)
        self.start_scheduler(scheduler_config(process.url))
        return process


@pytest.fixture
def start_extender(control_plane: ControlPlane, tmp_path: Path) -> Iterator[StartExtender]:
    """Factory: the extender command on a free port, ready (cache synced); stopped after the test."""
    started: list[ExtenderProcess] = []

    def start(**kwargs: Any) -> ExtenderProcess:
        (port,) = free_ports(1)
        process = ExtenderProcess(control_plane.kubeconfig, port, tmp_path / f"extender-{len(started)}.log",
                                  **{"bind_wait_s": 2.0, **kwargs})
        started.append(process)
        process.start()
        return process

    yield start
    for process in started:
        process.stop()


@pytest.fixture
def cluster(core: Core, namespace: str, make_gpu_node: MakeGpuNode, start_scheduler: StartScheduler,
            start_extender: StartExtender) -> Iterator[Cluster]:
    """The test's pods are deleted at once when it ends: in a namespace being deleted they would
    stay Pending (no kubelet confirms their end), and the next test's scheduler would try them."""
    yield Cluster(core, namespace, make_gpu_node, start_scheduler, start_extender)
    core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)


@pytest.fixture
def marker(api_client: kubernetes.client.ApiClient, namespace: str) -> Iterator[AllocationMarker]:
    with AllocationMarker(api_client, namespace) as running:
        yield running


def gpu_pod(name: str, *, request: str = "0.4", limit: str = "0.8", sm: str = "50", mem: str = "1Gi",
            extra: dict[str, str] | None = None) -> dict[str, object]:
    """A pod for the fastgshare scheduler asking for one vGPU slot and the given share."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": {**share_annotations(request, limit, sm, mem), **(extra or {})}},
            "spec": {"schedulerName": keys.SCHEDULER_NAME, "containers": [{
                "name": "main", "image": "registry.invalid/none:0",
                "resources": {"limits": {keys.VGPU_RESOURCE: "1"}, "requests": {"cpu": "10m"}}}]}}


def create_resident(core: Core, namespace: str, node: str, gpu_index: int) -> None:
    """A pod holding half of GPU ``gpu_index`` of ``node`` whole SMs: bound at creation, as if long ago,
    with the assignment the extender wrote then, signed for the pod's uid with the test key that
    :class:`ExtenderProcess` gives the extender (an unsigned one would not count)."""
    resident = gpu_pod("resident", request="0.5", limit="0.5", sm="100")
    resident["spec"]["nodeName"] = node  # type: ignore[index]
    uid = core.create_namespaced_pod(namespace, resident).metadata.uid
    assignment = PodAssignment(node_name=node, gpu_uuid=f"GPU-{node}-{gpu_index}", gpu_index=gpu_index,
                               assigned_at_ms=1, share=parse_share(share_annotations("0.5", "0.5", "100", "1Gi")))
    core.patch_namespaced_pod("resident", namespace, {"metadata": {"annotations": signed_annotations(uid, assignment)}})


def node_of(core: Core, namespace: str, name: str) -> str | None:
    return core.read_namespaced_pod(name, namespace).spec.node_name


def written_assignment(core: Core, namespace: str, name: str) -> PodAssignment:
    return decode_assignment(core.read_namespaced_pod(name, namespace).metadata.annotations[
        keys.POD_ASSIGNMENT_ANNOTATION])


def node_state(node: kubernetes.client.V1Node, pods: list[Any]) -> NodeState:
    """The core's view of a node: its inventory and the shares the API shows assigned to it."""
    state = NodeState(decode_node_inventory(node.metadata.annotations[keys.NODE_GPU_INFO_ANNOTATION]))
    for pod in pods:
        text = (pod.metadata.annotations or {}).get(keys.POD_ASSIGNMENT_ANNOTATION)
        if text is not None and (assigned := decode_assignment(text)).node_name == node.metadata.name:
            state.ledger(assigned.gpu_uuid).add(pod.metadata.name, assigned.share, force=True)
    return state


def predicted(nodes: list[kubernetes.client.V1Node], pods: list[Any], share: ShareSpec,
              policy: Policy) -> tuple[str, str]:
    """The node with the best score under ``policy`` and the GPU ``policy`` picks there."""
    states = [node_state(node, pods) for node in nodes]
    best = max(states, key=lambda state: score_node(state, share, policy))
    scores = sorted(score_node(state, share, policy) for state in states)
    assert scores[-1] > scores[-2], f"the prediction must not be a tie: {scores}"
    choice = evaluate_node(best, share, policy).choice
    assert choice is not None
    return best.name, choice.uuid


def test_pods_land_on_the_node_and_gpu_the_policy_predicts(cluster: Cluster, marker: AllocationMarker) -> None:
    core, namespace = cluster.core, cluster.namespace
    busy, idle = cluster.make_gpu_node(2), cluster.make_gpu_node(2)
    gpu1 = f"GPU-{busy.metadata.name}-1"
    create_resident(core, namespace, busy.metadata.name, 1)
    extender = cluster.start()

    nodes = [core.read_node(busy.metadata.name), core.read_node(idle.metadata.name)]
    cases = [("packed", {}, Policy.BINPACK, (busy.metadata.name, gpu1)),
             ("spread", {keys.SCHEDULING_POLICY_ANNOTATION: "spread"}, Policy.SPREAD,
              (idle.metadata.name, f"GPU-{idle.metadata.name}-0"))]
    for name, extra, policy, expected in cases:
        share = parse_share(share_annotations())
        prediction = predicted(nodes, core.list_namespaced_pod(namespace).items, share, policy)
        assert prediction == expected
        core.create_namespaced_pod(namespace, gpu_pod(name, extra=extra))
        wait_until(lambda name=name: node_of(core, namespace, name) is not None, what=f"pod {name} bound",
                   timeout_s=120)
        assignment = written_assignment(core, namespace, name)
        assert (node_of(core, namespace, name), assignment.gpu_uuid) == prediction
        assert assignment.node_name == prediction[0]
        assert (assignment.share.request_permille, assignment.share.sm_percent) == (400, 50)

    view = get_json(f"{extender.url}/inspect?node={busy.metadata.name}")
    pods = view["nodes"][busy.metadata.name]["gpus"][1]["pods"]
    assert sorted(pod["pod"] for pod in pods) == [f"{namespace}/packed", f"{namespace}/resident"]
    # Filter passed only the best node each time, so the scheduler bound it without calling prioritize.
    with urllib.request.urlopen(f"{extender.url}/metrics", timeout=10) as answer:
        metrics = answer.read().decode()
    assert 'fastgshare_extender_decisions_total{result="outscored",verb="filter"} 2.0' in metrics
    assert 'verb="prioritize"' not in metrics


def failed_scheduling_messages(core: Core, namespace: str, name: str) -> list[str]:
    events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
    return [event.message or "" for event in events if event.reason == "FailedScheduling"]


def test_pod_that_fits_nowhere_stays_pending_with_our_reason(cluster: Cluster) -> None:
    core, namespace = cluster.core, cluster.namespace
    cluster.make_gpu_node(2)
    cluster.start()
    core.create_namespaced_pod(namespace, gpu_pod("too-big", mem="40Gi"))
    core.create_namespaced_pod(namespace, gpu_pod("invalid", sm="150"))

    for name, reason in (("too-big", "needs 40 GiB of GPU memory, largest free 16 GiB"),
                         ("invalid", "fastgshare/gpu_sm_partition")):
        wait_until(lambda name=name, reason=reason: any(reason in message for message in
                                                        failed_scheduling_messages(core, namespace, name)),
                   what=f"a FailedScheduling event for {name} with our reason", timeout_s=120)
        assert node_of(core, namespace, name) is None
        assert core.read_namespaced_pod(name, namespace).status.phase == "Pending"


SMALL = {"request": "0.3", "limit": "0.3", "sm": "40", "mem": "1Gi"}  # 3 x 2 of them fill a GPU


def placed_pods(core: Core, namespace: str) -> list[Any]:
    return [pod for pod in core.list_namespaced_pod(namespace).items if pod.spec.node_name]


def unschedulable(core: Core, namespace: str) -> int:
    return sum(1 for pod in core.list_namespaced_pod(namespace).items
               if any(c.type == "PodScheduled" and c.status == "False" for c in pod.status.conditions or []))


def assert_nothing_over_committed(core: Core, namespace: str, nodes: list[kubernetes.client.V1Node]) -> None:
    """Replay every written assignment into fresh ledgers; adding raises on any over-commit."""
    inventories = {node.metadata.name: decode_node_inventory(node.metadata.annotations[
        keys.NODE_GPU_INFO_ANNOTATION]) for node in nodes}
    ledgers: dict[str, GpuLedger] = {}
    for pod in placed_pods(core, namespace):
        assignment = decode_assignment(pod.metadata.annotations[keys.POD_ASSIGNMENT_ANNOTATION])
        assert assignment.node_name == pod.spec.node_name
        inventory = inventories[assignment.node_name]
        gpu = inventory.gpu(assignment.gpu_uuid)
        assert gpu is not None
        assert gpu.index == assignment.gpu_index
        ledger = ledgers.setdefault(gpu.uuid, GpuLedger(gpu, inventory.slots_per_gpu))
        ledger.add(pod.metadata.name, assignment.share)


def test_fifty_pods_created_at_once_over_commit_nothing(cluster: Cluster, marker: AllocationMarker) -> None:
    core, namespace = cluster.core, cluster.namespace
    nodes = [cluster.make_gpu_node(2) for _ in range(3)]  # 6 GPUs x 6 pods = room for 36 of the 50
    extender = cluster.start()
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda i: core.create_namespaced_pod(namespace, gpu_pod(f"p{i:02d}", **SMALL)), range(50)))

    wait_until(lambda: len(placed_pods(core, namespace)) == 36 and unschedulable(core, namespace) == 14,
               what="36 pods bound and 14 unschedulable", timeout_s=300, interval_s=1)
    assert_nothing_over_committed(core, namespace, nodes)
    view = get_json(f"{extender.url}/inspect")
    held = [pod for node in nodes for gpu in view["nodes"][node.metadata.name]["gpus"] for pod in gpu["pods"]]
    assert len(held) == 36


def test_restarting_the_extender_mid_stream_double_books_nothing(cluster: Cluster,
                                                                  marker: AllocationMarker) -> None:
    core, namespace = cluster.core, cluster.namespace
    nodes = [cluster.make_gpu_node(1) for _ in range(2)]  # room for 12 of the 20
    extender = cluster.start()

    def stream() -> None:
        for i in range(20):
            core.create_namespaced_pod(namespace, gpu_pod(f"s{i:02d}", **SMALL))
            time.sleep(0.1)

    creator = threading.Thread(target=stream)
    creator.start()
    wait_until(lambda: len(placed_pods(core, namespace)) >= 4, what="the first pods bound", timeout_s=120)
    extender.stop(signal.SIGKILL)  # a crash, perhaps in the middle of a bind
    time.sleep(1)
    extender.start()  # same port: the scheduler's calls reach the new process
    creator.join(60)
    # Pods whose filter failed during the outage are parked until the scheduler's 60 s flush of
    # its unschedulable queue, or until a cluster event; label the nodes to be that event.
    for node in nodes:
        core.patch_node(node.metadata.name, {"metadata": {"labels": {"test.fastgshare/nudge": "1"}}})

    wait_until(lambda: len(placed_pods(core, namespace)) == 12 and unschedulable(core, namespace) == 8,
               what="12 pods bound and 8 unschedulable", timeout_s=300, interval_s=1)
    assert_nothing_over_committed(core, namespace, nodes)
    view = get_json(f"{extender.url}/inspect")
    held = sorted(pod["pod"] for node in nodes for gpu in view["nodes"][node.metadata.name]["gpus"]
                  for pod in gpu["pods"])
    assert held == sorted(f"{namespace}/{pod.metadata.name}" for pod in placed_pods(core, namespace))


def test_scheduling_events_show_our_reasons_ungarbled(cluster: Cluster) -> None:
    """kube-scheduler passes extender reasons through a format string: a ``%`` in them comes out as
    ``%!S(MISSING)``. Defect 1 of issue 15: every reason we give must read as we wrote it."""
    core, namespace = cluster.core, cluster.namespace
    node = cluster.make_gpu_node(1)
    create_resident(core, namespace, node.metadata.name, 0)
    cluster.start()
    core.create_namespaced_pod(namespace, gpu_pod("crowded", request="0.6", limit="0.6", sm="90"))
    core.create_namespaced_pod(namespace, gpu_pod("percent-sign", sm="50%"))

    for name, reason in (("crowded", "no GPU with 90"), ("percent-sign", "fastgshare/gpu_sm_partition")):
        wait_until(lambda name=name, reason=reason: any(reason in message for message in
                                                        failed_scheduling_messages(core, namespace, name)),
                   what=f"a FailedScheduling event for {name} with our reason", timeout_s=120)
        messages = [message for message in failed_scheduling_messages(core, namespace, name) if reason in message]
        assert not any("%!" in message for message in messages), messages


def test_sixteen_one_gib_pods_do_not_all_land_on_a_16_gib_gpu_with_a_300_mib_context_reserve(
        cluster: Cluster, marker: AllocationMarker) -> None:
    """Issue 36 item 3: each pod is charged its GPU's context reserve next to its gpu_mem, so twelve
    1 GiB pods fill 16 GiB (12 x 1324 MiB; 496 MiB left), and the other four hear why."""
    core, namespace = cluster.core, cluster.namespace
    (gpu,) = fake_gpus("ctx-reserve", 1)
    node = cluster.make_gpu_node([attrs.evolve(gpu, context_reserve_bytes=300 * 2**20)])
    cluster.start()
    tiny = {"request": "0.05", "limit": "0.05", "sm": "100", "mem": "1Gi"}  # sixteen fit the time x SM bin
    for i in range(16):
        core.create_namespaced_pod(namespace, gpu_pod(f"r{i:02d}", **tiny))

    wait_until(lambda: len(placed_pods(core, namespace)) == 12 and unschedulable(core, namespace) == 4,
               what="12 pods bound and 4 unschedulable", timeout_s=300, interval_s=1)
    assert_nothing_over_committed(core, namespace, [core.read_node(node.metadata.name)])
    waiting = [pod.metadata.name for pod in core.list_namespaced_pod(namespace).items if not pod.spec.node_name]
    reason = "needs 1 GiB of GPU memory + 300 MiB context reserve, largest free 496 MiB"
    wait_until(lambda: any(reason in message for message in failed_scheduling_messages(core, namespace, waiting[0])),
               what=f"a FailedScheduling event for {waiting[0]} naming the context reserve", timeout_s=120)
