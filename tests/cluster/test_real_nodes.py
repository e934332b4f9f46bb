"""Real-node tier, three nodes (issue 38): ``fastgshare cluster up --nodes 3`` on this machine, the
first node the host, the other two machines of their own in Linux namespaces (each with its
kubelet, containerd, pod subnet, simulated GPUs and node agent).

What a user of several GPU nodes meets: pods placed across nodes as the placement policy says,
with the extender's ledger and each node's simulated GPUs agreeing at every step; pods on
different nodes reaching each other by IP; a node lost at once (``cluster power-off``: its
kubelet, containerd, node agent and pods killed together) and its pods replaced elsewhere, no
GPU over-committed meanwhile and the dead node's GPUs not offered, then the node back with its
stale pods cleaned up; the extender restarted while a node is down; a node drained and
uncordoned.

The cluster shortens Kubernetes' node-loss timeouts (``cluster.NODE_LEASE_SECONDS``,
``NODE_MONITOR_GRACE``, ``NODE_LOSS_TOLERATION_SECONDS``; docs/cluster.md). The times measured
here are printed, not asserted (``bench/real_node.py`` reports them).
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from fastgshare import keys
from fastgshare_cli.pod_shares import measure_shares, use_by_pod
from fastgshare_cluster import cluster as local_cluster
from fastgshare_cluster import machines
from fastgshare_cluster.cluster import Cluster
from fastgshare_cluster.images import FAKE_FN_IMAGE_SHORT
from fastgshare_cluster.processes import http_ok, wait_until
from tests.cluster.conftest import local_cluster_for_tests
from tests.cluster.controlplane import Binaries
from tests.cluster.real_node import (  # noqa: F401 - fixtures
    apply,
    assignment_of,
    describe_pod,
    fastpod,
    gpu_pod,
    http,
    inspect,
    kubectl,
    real_node_core,
    real_node_test_namespace,
    running_pods,
    share_annotations,
    tenant_container,
)

pytestmark = pytest.mark.realnode

NODES = 3
GPUS_PER_NODE = 2  # cluster.DEFAULT_GPUS
HALF_GPU = share_annotations(0.5, 0.5, 100, "512Mi")  # two pods fill a GPU's time x SM area
TENANT = {"TENANT_MEMORY": "256Mi"}


@pytest.fixture(scope="module")
def real_cluster(cluster_binaries: Binaries, real_node_turn: None,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three nodes for this module; after ``down``, no link, cgroup or rule of theirs is left."""
    with local_cluster_for_tests(tmp_path_factory, nodes=NODES) as running:
        yield running
    plans = machines.plan_nodes(NODES, local_cluster.DEFAULT_SUBNET, running.node_name)
    left = [plan.host_link for plan in plans if Path(f"/sys/class/net/{plan.host_link}").exists()]
    left += [str(top / plan.name) for plan in plans[1:] for top in Path("/sys/fs/cgroup").iterdir()
             if (top / plan.name).exists()]
    assert not left, f"cluster down left the nodes' links or cgroups: {left}"
    assert not machines.forwarding_present(), f"cluster down left the iptables chain {machines.FORWARD_CHAIN}"


# --- what the extender and the simulated GPUs say -----------------------------------------------

def extender_ledger(cluster: Cluster) -> dict[str, dict[str, Any]]:
    """GPU uuid -> the extender's view of it (/inspect), with ``node`` added."""
    with urllib.request.urlopen(f"{cluster.extender_url}/inspect", timeout=10) as answer:
        view = json.load(answer)
    return {gpu["uuid"]: {**gpu, "node": name} for name, node in view["nodes"].items() for gpu in node["gpus"]}


def gpu_pods(cluster: Cluster) -> dict[str, set[str]]:
    """GPU uuid -> UIDs of the pods whose processes hold it, read from each node's simulated GPUs."""
    found = {}
    for name in cluster.node_names:
        node_cgroup = "/" if name == cluster.node_name else f"/{name}"
        for gpu_dir in sorted((cluster.fake_gpu_dir("", name)).glob("*")):
            found[gpu_dir.name] = set(use_by_pod(gpu_dir, node_cgroup))
    return found


def ledger_and_gpus_disagree(cluster: Cluster) -> list[str]:
    """Every pod a simulated GPU runs that the extender's ledger does not hold on that GPU, and
    every GPU whose ledger is over-committed; empty when they agree."""
    ledger = extender_ledger(cluster)
    problems = []
    for uuid, uids in gpu_pods(cluster).items():
        held = {pod["uid"] for pod in ledger.get(uuid, {}).get("pods", [])}
        problems += [f"pod {uid} runs on {uuid} but the ledger does not hold it there" for uid in uids - held]
    problems += [f"GPU {uuid} on {gpu['node']} is over-committed in the ledger" for uuid, gpu in ledger.items()
                 if gpu["overcommitted"] or gpu["areaUsed"] > 1.0 + 1e-9]
    return problems


def watch_agreement(cluster: Cluster, until: Any, *, what: str, timeout_s: float) -> int:
    """Poll ``until()`` while checking at each step that the ledger and the GPUs agree; returns
    how many steps were checked."""
    deadline, steps = time.monotonic() + timeout_s, 0
    while True:
        problems = ledger_and_gpus_disagree(cluster)
        assert not problems, f"step {steps}: {problems}"
        steps += 1
        if until():
            return steps
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f}s waiting for {what}"
        time.sleep(0.5)


def pods_by_gpu(pods: list[kubernetes.client.V1Pod]) -> dict[str, tuple[str, int]]:
    """GPU uuid -> (node, number of the pods on it)."""
    counts = Counter((assignment_of(pod).node_name, assignment_of(pod).gpu_uuid) for pod in pods)
    return {gpu: (node, count) for (node, gpu), count in counts.items()}


def all_running(core: kubernetes.client.CoreV1Api, namespace: str, count: int) -> bool:
    pods = [p for p in core.list_namespaced_pod(namespace).items if not p.metadata.deletion_timestamp]
    return len(pods) == count and all(
        p.status.phase == "Running" and p.status.container_statuses
        and all(c.state.running for c in p.status.container_statuses) for p in pods)


def exec_in(cluster: Cluster, namespace: str, pod: str, script: str) -> subprocess.Popen[str]:
    return subprocess.Popen(["kubectl", f"--kubeconfig={cluster.kubeconfig}", "-n", namespace, "exec", pod, "--",
                             "sh", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# --- the nodes -----------------------------------------------------------------------------------

def test_three_nodes_each_with_its_own_subnet_gpus_and_node_agent(real_cluster: Cluster,
                                                                     core: kubernetes.client.CoreV1Api) -> None:
    nodes = {node.metadata.name: node for node in core.list_node().items}
    assert sorted(nodes) == sorted(real_cluster.node_names)
    assert len(nodes) == NODES
    plans = {plan.name: plan for plan in machines.plan_nodes(NODES, local_cluster.DEFAULT_SUBNET,
                                                               real_cluster.node_name)}
    inventories = {}
    for name, node in nodes.items():
        address = next(a.address for a in node.status.addresses if a.type == "InternalIP")
        assert address == plans[name].node_ip, f"{name} registered {address}, not its subnet's {plans[name].node_ip}"
        assert node.status.allocatable[keys.VGPU_RESOURCE] == str(GPUS_PER_NODE * 16)
        inventories[name] = json.loads(node.metadata.annotations[keys.NODE_GPU_INFO_ANNOTATION])
    uuids = [gpu["uuid"] for inventory in inventories.values() for gpu in inventory["gpus"]]
    assert len(set(uuids)) == NODES * GPUS_PER_NODE, f"each node's agent has GPUs of its own: {uuids}"
    for name in real_cluster.node_names:  # each node's agent keeps its own simulated GPUs
        assert len(list(real_cluster.fake_gpu_dir("", name).glob("*"))) == GPUS_PER_NODE


@pytest.mark.parametrize("policy", ["spread", "binpack"])
def test_six_replicas_land_as_the_placement_policy_says_and_the_ledger_agrees_with_the_gpus(
        real_cluster: Cluster, core: kubernetes.client.CoreV1Api, namespace: str, policy: str) -> None:
    """Scaled one replica at a time, so that each placement is the policy's choice with the ones
    before it known (a burst is placed by kube-scheduler before our extender hears of the binds
    before it: docs/cluster.md, "Several nodes")."""
    annotations = {**HALF_GPU, keys.SCHEDULING_POLICY_ANNOTATION: policy}
    steps = 0
    for replicas in range(1, 7):
        apply(real_cluster, namespace, fastpod("six", annotations, TENANT, replicas=replicas))
        steps += watch_agreement(real_cluster, lambda count=replicas: all_running(core, namespace, count),
                                 what=f"{replicas} running pods", timeout_s=90)
    pods = running_pods(core, namespace, 6)
    placed = pods_by_gpu(pods)
    per_node = Counter(node for node, count in placed.values() for _ in range(count))
    print(f"{policy}: {dict(per_node)} over {len(placed)} GPUs; ledger and GPUs agreed at {steps} steps")
    if policy == "spread":  # six GPUs, six pods: one each, two per node
        assert sorted(count for _, count in placed.values()) == [1] * 6, placed
        assert sorted(per_node.values()) == [2, 2, 2], per_node
    else:  # binpack fills GPUs (two pods each) and a node's GPUs before the next node's
        assert sorted(count for _, count in placed.values()) == [2, 2, 2], placed
        assert sorted(per_node.values()) == [2, 4], per_node
    wait_until(lambda: {pod.metadata.uid for pod in pods} <= set().union(*gpu_pods(real_cluster).values()),
               what="every pod's tenant on its simulated GPU", timeout_s=30)
    assert not ledger_and_gpus_disagree(real_cluster)
    # each GPU's pods get their configured half: measured by the simulated GPUs themselves
    gpus = [(real_cluster.fake_gpu_dir(gpu, node), "/" if node == real_cluster.node_name else f"/{node}")
            for gpu, (node, _) in placed.items()]
    shares = measure_shares([path for path, _ in gpus], 3.0, [root for _, root in gpus])
    assert all(0.4 <= shares[pod.metadata.uid] <= 0.55 for pod in pods), shares
    # `fastgshare inspect` shows every node, each node agent's achieved shares (over its last 10 s)
    # read through the API server
    def inspected() -> dict[str, tuple[str, Any]]:
        report = json.loads(inspect(real_cluster, "-o", "json"))
        assert sorted(node["name"] for node in report["nodes"]) == sorted(real_cluster.node_names), report
        return {pod["name"]: (node["name"], pod) for node in report["nodes"] for gpu in node["gpus"]
                for pod in gpu["pods"] if pod["namespace"] == namespace}

    listed: list[dict[str, tuple[str, Any]]] = []
    wait_until(lambda: bool(listed.append(inspected()) or all(
        pod["achieved"]["share"] is not None and 0.4 <= pod["achieved"]["share"] <= 0.55
        for _, pod in listed[-1].values())), what="inspect showing each pod's half", timeout_s=30, interval_s=2)
    assert sorted(listed[-1]) == sorted(pod.metadata.name for pod in pods)


def test_pods_on_different_nodes_reach_each_other_by_ip(real_cluster: Cluster, core: kubernetes.client.CoreV1Api,
                                                        namespace: str) -> None:
    apply(real_cluster, namespace, fastpod("talk", {**HALF_GPU, keys.SCHEDULING_POLICY_ANNOTATION: "spread"}, {},
                                           replicas=6))
    pods = running_pods(core, namespace, 6)
    by_node = {}
    for pod in pods:
        by_node.setdefault(pod.spec.node_name, pod)
    assert len(by_node) == NODES
    names = real_cluster.node_names
    for source, target in ((names[0], names[2]), (names[2], names[1]), (names[1], names[0])):
        listener = exec_in(real_cluster, namespace, by_node[target].metadata.name,
                           f"echo hello-from-{target} | nc -l -p 9000")
        try:
            time.sleep(1)
            answer = subprocess.run(["kubectl", f"--kubeconfig={real_cluster.kubeconfig}", "-n", namespace, "exec",
                                     by_node[source].metadata.name, "--", "sh", "-c",
                                     f"nc {by_node[target].status.pod_ip} 9000 </dev/null"],
                                    capture_output=True, text=True, timeout=30, check=False)
            assert answer.stdout.strip() == f"hello-from-{target}", (source, target, answer.stderr)
        finally:
            listener.kill()
            listener.wait()


# --- a node lost, and back -------------------------------------------------------------------------

def test_a_node_lost_at_once_has_its_pods_replaced_on_the_others_and_comes_back_clean(
        real_cluster: Cluster, core: kubernetes.client.CoreV1Api, namespace: str) -> None:
    apply(real_cluster, namespace, fastpod("lost", {**HALF_GPU, keys.SCHEDULING_POLICY_ANNOTATION: "spread"}, TENANT,
                                           replicas=4))
    pods = running_pods(core, namespace, 4)
    victim = next(name for name in real_cluster.node_names[1:] if any(p.spec.node_name == name for p in pods))
    doomed = {p.metadata.uid for p in pods if p.spec.node_name == victim}
    dead_gpus = {gpu for gpu, (node, _) in pods_by_gpu(pods).items() if node == victim}
    started = time.monotonic()
    local_cluster.power_off(real_cluster.state_dir, victim, say=print)
    try:
        def replaced() -> bool:
            live = [p for p in core.list_namespaced_pod(namespace).items
                    if not p.metadata.deletion_timestamp and p.metadata.uid not in doomed]
            return len(live) == 4 and all_running(core, namespace, 4)

        # meanwhile: no GPU over-committed, no pod put on the dead node, ledger and GPUs agree
        def check() -> bool:
            for pod in core.list_namespaced_pod(namespace).items:
                if pod.metadata.uid not in doomed and pod.metadata.annotations.get(keys.POD_ASSIGNMENT_ANNOTATION):
                    assert assignment_of(pod).node_name != victim, f"{pod.metadata.name} put on the dead {victim}"
            return replaced()

        steps = watch_agreement(real_cluster, check, what=f"the pods of {victim} replaced elsewhere", timeout_s=150)
        failover_s = time.monotonic() - started
        node = core.read_node(victim)
        ready = next(c for c in node.status.conditions if c.type == "Ready")
        assert ready.status != "True", f"{victim} still Ready after its kubelet died"
        print(f"node {victim} lost: its {len(doomed)} pods replaced on the other nodes in {failover_s:.1f} s "
              f"({steps} steps checked)")

        # the extender restarted while the node is down rebuilds the same ledger
        before = {uuid: sorted(p["uid"] for p in gpu["pods"]) for uuid, gpu in extender_ledger(real_cluster).items()}
        local_cluster.restart(real_cluster.state_dir, "extender", say=print, die_with_parent=True)
        wait_until(lambda: http_ok(f"{real_cluster.extender_url}/readyz"), what="the extender ready", timeout_s=60)
        after = {uuid: sorted(p["uid"] for p in gpu["pods"]) for uuid, gpu in extender_ledger(real_cluster).items()}
        assert after == before, "the restarted extender's ledger differs"
        counted = Counter(uid for uids in after.values() for uid in uids)
        assert all(n == 1 for n in counted.values()), f"a pod counted twice: {counted}"
        live = {p.metadata.uid for p in core.list_namespaced_pod(namespace).items}
        assert live <= set(counted), f"pods the restarted extender forgot: {live - set(counted)}"
        assert all(uuid not in dead_gpus or set(uids) <= doomed for uuid, uids in after.items())
    finally:
        local_cluster.power_on(real_cluster.state_dir, victim, say=print, die_with_parent=True)

    # back: Ready, the stale pods gone, its GPUs offered again
    wait_until(lambda: next(c for c in core.read_node(victim).status.conditions if c.type == "Ready").status == "True",
               what=f"{victim} Ready again", timeout_s=90)
    wait_until(lambda: not ({p.metadata.uid for p in core.list_namespaced_pod(namespace).items} & doomed),
               what=f"the stale pods of {victim} cleaned up", timeout_s=90)
    wait_until(lambda: not any(taint.key.startswith("node.kubernetes.io/")
                               for taint in core.read_node(victim).spec.taints or []),
               what=f"{victim}'s taints lifted", timeout_s=60)
    pinned = gpu_pod("back", HALF_GPU, tenant_container(TENANT))
    pinned["spec"]["nodeSelector"] = {"kubernetes.io/hostname": victim}
    apply(real_cluster, namespace, pinned)
    wait_until(lambda: core.read_namespaced_pod("back", namespace).status.phase == "Running",
               what=f"a pod on {victim} again", timeout_s=90)
    assert assignment_of(core.read_namespaced_pod("back", namespace)).node_name == victim
    assert not ledger_and_gpus_disagree(real_cluster)


def test_a_drained_node_has_its_pods_moved_with_their_shares_and_uncordon_returns_it(
        real_cluster: Cluster, core: kubernetes.client.CoreV1Api, namespace: str) -> None:
    apply(real_cluster, namespace, fastpod("drained", {**HALF_GPU, keys.SCHEDULING_POLICY_ANNOTATION: "spread"},
                                           TENANT, replicas=3))
    pods = running_pods(core, namespace, 3)
    # Spread may put two pods of a burst on one node (extenders do not see kube-scheduler's assumed pods,
    # docs/cluster.md): drain a node other than this host that got one.
    target = next((node for node in real_cluster.node_names[1:] if any(p.spec.node_name == node for p in pods)), "")
    moved = {p.metadata.uid for p in pods if p.spec.node_name == target}
    assert moved, f"no pod off this host: {[describe_pod(p) for p in pods]}"
    kubectl(real_cluster, "drain", target, "--ignore-daemonsets", "--timeout=120s")
    try:
        assert core.read_node(target).spec.unschedulable
        watch_agreement(real_cluster, lambda: all_running(core, namespace, 3)
                        and not any(p.metadata.uid in moved for p in core.list_namespaced_pod(namespace).items),
                        what=f"the pods of {target} moved", timeout_s=120)
        pods = running_pods(core, namespace, 3)
        assert all(p.spec.node_name != target for p in pods)
        placed = pods_by_gpu(pods)
        gpus = [(real_cluster.fake_gpu_dir(gpu, node), "/" if node == real_cluster.node_name else f"/{node}")
                for gpu, (node, _) in placed.items()]
        wait_until(lambda: {p.metadata.uid for p in pods} <= set().union(*gpu_pods(real_cluster).values()),
                   what="the moved pods' tenants on their GPUs", timeout_s=30)
        shares = measure_shares([path for path, _ in gpus], 3.0, [root for _, root in gpus])
        assert all(0.4 <= shares[p.metadata.uid] <= 0.55 for p in pods), shares
    finally:
        kubectl(real_cluster, "uncordon", target)
    assert not core.read_node(target).spec.unschedulable
    pinned = gpu_pod("back", HALF_GPU, tenant_container(TENANT))
    pinned["spec"]["nodeSelector"] = {"kubernetes.io/hostname": target}
    apply(real_cluster, namespace, pinned)
    wait_until(lambda: core.read_namespaced_pod("back", namespace).status.phase == "Running",
               what=f"a pod on {target} after uncordon", timeout_s=90)
    assert assignment_of(core.read_namespaced_pod("back", namespace)).node_name == target


# --- a function across nodes -------------------------------------------------------------------------

FUNCTION = "across"
FUNCTION_NAMESPACE = keys.DEFAULT_FUNCTION_NAMESPACE
LOAD_SECONDS = 60
LOAD_WORKERS = 4


def function_fastpod(nodes: list[str], replicas: int) -> dict[str, Any]:
    """A function as the original's user flow writes it: a FaSTPod of the fake model server in the
    function namespace with OpenFaaS scale labels, its pods kept on ``nodes``."""
    return {
        "apiVersion": keys.FASTPOD_API_VERSION, "kind": keys.FASTPOD_KIND,
        "metadata": {"name": FUNCTION, "labels": {keys.OPENFAAS_SCALE_MIN_LABEL: str(replicas),
                                                  keys.OPENFAAS_SCALE_MAX_LABEL: str(replicas)},
                     "annotations": {**share_annotations(0.3, 0.5, 50, "256Mi"),
                                     keys.SCHEDULING_POLICY_ANNOTATION: "spread"}},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": FUNCTION}},
                 "podSpec": {"terminationGracePeriodSeconds": 1,
                             "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                                 "nodeSelectorTerms": [{"matchExpressions": [{
                                     "key": "kubernetes.io/hostname", "operator": "In", "values": nodes}]}]}}},
                             "containers": [{
                                 "name": "fn", "image": FAKE_FN_IMAGE_SHORT, "imagePullPolicy": "IfNotPresent",
                                 "ports": [{"containerPort": keys.FUNCTION_PORT}],
                                 "env": [{"name": "FAKE_FN_GPU_MS", "value": "2"}]}]}},
    }


@pytest.fixture
def function_namespace(core: kubernetes.client.CoreV1Api) -> Iterator[str]:
    """The function namespace ``up`` made; emptied afterwards, the FaSTPod first."""
    yield FUNCTION_NAMESPACE
    custom = kubernetes.client.CustomObjectsApi(core.api_client)
    custom.delete_collection_namespaced_custom_object(keys.API_GROUP, "v1", FUNCTION_NAMESPACE, keys.FASTPOD_PLURAL)
    core.delete_collection_namespaced_pod(FUNCTION_NAMESPACE)
    wait_until(lambda: not core.list_namespaced_pod(FUNCTION_NAMESPACE).items,
               what=f"no pods left in {FUNCTION_NAMESPACE}", timeout_s=120)


def ready_pods(core: kubernetes.client.CoreV1Api) -> list[kubernetes.client.V1Pod]:
    return [p for p in core.list_namespaced_pod(FUNCTION_NAMESPACE).items if not p.metadata.deletion_timestamp
            and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])]


def load(cluster: Cluster, seconds: float, outcomes: list[tuple[float, int, str]]) -> None:
    """POST to the function in a loop for ``seconds``: (time, status, answering pod) per request."""
    url = f"{cluster.gateway_url}/function/{FUNCTION}/infer"
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        status, body = http(url, method="POST", body=b"x", timeout_s=30)
        pod = json.loads(body).get("pod", "") if status == 200 else body.decode(errors="replace")[:200]
        outcomes.append((time.monotonic(), status, pod))
        time.sleep(0.02)


def test_a_function_on_two_nodes_keeps_answering_when_one_dies(
        real_cluster: Cluster, core: kubernetes.client.CoreV1Api, function_namespace: str) -> None:
    serving = real_cluster.node_names[1:]
    apply(real_cluster, function_namespace, function_fastpod(serving, 4))
    wait_until(lambda: len(ready_pods(core)) == 4, what="4 ready pods of the function", timeout_s=120)
    node_of = {f"{FUNCTION_NAMESPACE}/{p.metadata.name}": p.spec.node_name for p in ready_pods(core)}
    assert set(node_of.values()) == set(serving), node_of
    victim, survivor = serving[1], serving[0]

    outcomes: list[tuple[float, int, str]] = []
    workers = [threading.Thread(target=load, args=(real_cluster, LOAD_SECONDS, outcomes)) for _ in range(LOAD_WORKERS)]
    started = time.monotonic()
    for worker in workers:
        worker.start()
    try:
        time.sleep(10)
        local_cluster.power_off(real_cluster.state_dir, victim, say=print)
        killed_at = time.monotonic()
        wait_until(lambda: len(ready_pods(core)) == 4 and all(p.spec.node_name == survivor for p in ready_pods(core)),
                   what=f"4 ready pods again, on {survivor}", timeout_s=LOAD_SECONDS)
        restored_s = time.monotonic() - killed_at
    finally:
        for worker in workers:
            worker.join()
        local_cluster.power_on(real_cluster.state_dir, victim, say=print, die_with_parent=True)
    failed = [o for o in outcomes if o[1] != 200]
    fraction = len(failed) / max(len(outcomes), 1)
    print(f"function across nodes: {len(outcomes)} requests in {time.monotonic() - started:.0f} s, "
          f"{len(failed)} failed ({fraction:.2%}): {Counter(status for _, status, _ in failed)}; "
          f"capacity restored {restored_s:.1f} s after the node died")
    answered_by = {node_of.get(pod) for at, status, pod in outcomes if status == 200 and at < killed_at}
    assert answered_by == set(serving), f"the gateway routed to {answered_by} before the loss, not to both nodes"
    assert fraction <= 0.01, failed[:10]
    wait_until(lambda: next(c for c in core.read_node(victim).status.conditions if c.type == "Ready").status == "True",
               what=f"{victim} Ready again", timeout_s=90)
