"""A whole cluster on this machine: how fast it comes up and goes down, and how fast pods start
(prints one JSON object). Needs root and the binaries of ``make control-plane``.

In one run, side by side:

1. ``fastgshare cluster up`` (the library call) until every node is schedulable with vGPU capacity;
2. plain pods (default scheduler, no GPU), created one after another: create -> Running;
3. GPU pods through the ``fastgshare-scheduler`` profile and our extender (assignment, bind,
   kubelet's Allocate), one after another, and then a burst created at once;
4. with ``--nodes`` 2 or more: what each node costs (the resident memory of its containerd,
   kubelet and node agent, and their CPU over an idle 20 s), and a node lost at once
   (``cluster.power_off``) under a FaSTPod whose pods spread over the nodes: the time from the
   node's death to all its replacement pods Running on the others;
5. ``down``.

Pods are not deleted between phases: kubelet v1.20's device manager can panic when a pod is
force-deleted while the next is admitted (kubernetes#103838, fixed in 1.24), which would stall
the measurement rather than measure anything of ours.

Run: ``python -m bench.real_node [--pods N] [--nodes N] [--state-dir DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes.client

from fastgshare import keys
from fastgshare_cluster import cluster
from fastgshare_cluster.cluster import ClusterError, Options
from fastgshare_cluster.images import TENANT_IMAGE_SHORT

SHARE = {keys.GPU_QUOTA_REQUEST: "0.02", keys.GPU_QUOTA_LIMIT: "0.05", keys.GPU_SM_PARTITION: "10",
         keys.GPU_MEM: "256Mi"}


def pod(name: str, gpu: bool) -> Any:
    container: dict[str, Any] = {"name": "c", "image": TENANT_IMAGE_SHORT, "command": ["sh", "-c", "sleep 3600"]}
    spec: dict[str, Any] = {"terminationGracePeriodSeconds": 0, "containers": [container]}
    metadata: dict[str, Any] = {"name": name}
    if gpu:
        container["resources"] = {"limits": {keys.VGPU_RESOURCE: "1"}}
        spec["schedulerName"] = keys.SCHEDULER_NAME
        metadata["annotations"] = SHARE
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def running_at(core: kubernetes.client.CoreV1Api, namespace: str, names: list[str],
               timeout_s: float = 300) -> dict[str, float]:
    """Name -> monotonic time its pod was first seen Running with its container started."""
    seen: dict[str, float] = {}
    deadline = time.monotonic() + timeout_s
    while len(seen) < len(names) and time.monotonic() < deadline:
        items: list[Any] = core.list_namespaced_pod(namespace).items
        for item in items:
            statuses = item.status.container_statuses or []
            if (item.metadata.name in names and item.metadata.name not in seen and statuses
                    and all(s.state.running for s in statuses)):
                seen[item.metadata.name] = time.monotonic()
        time.sleep(0.05)
    if len(seen) < len(names):
        raise RuntimeError(f"only {len(seen)} of {len(names)} pods ran within {timeout_s:.0f}s")
    return seen


def summary(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    return {"count": len(ordered), "median_s": round(statistics.median(ordered), 3),
            "p90_s": round(ordered[int(0.9 * (len(ordered) - 1))], 3), "max_s": round(ordered[-1], 3)}


def sequential(core: kubernetes.client.CoreV1Api, namespace: str, count: int, gpu: bool) -> dict[str, float]:
    latencies = []
    for index in range(count):
        name = f"{'gpu' if gpu else 'plain'}-{index}"
        created = time.monotonic()
        core.create_namespaced_pod(namespace, pod(name, gpu))
        latencies.append(running_at(core, namespace, [name], 120)[name] - created)
    return summary(latencies)


def burst(core: kubernetes.client.CoreV1Api, namespace: str, count: int) -> dict[str, float]:
    names = [f"burst-{index}" for index in range(count)]  # "gpu-*" from the sequential phase still run
    created = time.monotonic()
    for name in names:
        core.create_namespaced_pod(namespace, pod(name, gpu=True))
    running = running_at(core, namespace, names)
    result = summary([running[name] - created for name in names])
    result["all_running_s"] = round(max(running.values()) - created, 3)
    return result


# Half a GPU's time x SM area each: spread puts one on each GPU, two on each node.
HALF_GPU = {keys.GPU_QUOTA_REQUEST: "0.5", keys.GPU_QUOTA_LIMIT: "0.5", keys.GPU_SM_PARTITION: "100",
            keys.GPU_MEM: "256Mi"}
NODE_COMPONENTS = ("containerd", "kubelet", "node-agent")
IDLE_S = 20.0


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def node_costs(state_dir: Path, nodes: list[str]) -> dict[str, dict[str, float]]:
    """Per node: the resident memory (MiB) of its containerd, kubelet and node agent, and their CPU
    (percent of one core) over an idle :data:`IDLE_S`."""
    components = {status.name: status.pid for status in cluster.status(state_dir) if status.running}

    def pids(index: int, name: str) -> list[int]:
        wanted = [f"{component}{cluster.NODE_SEPARATOR}{name}" if index else component
                  for component in NODE_COMPONENTS]
        return [components[component] for component in wanted if component in components]

    before = {name: sum(_cpu_seconds(pid) for pid in pids(index, name)) for index, name in enumerate(nodes)}
    time.sleep(IDLE_S)
    costs = {}
    for index, name in enumerate(nodes):
        cpu = sum(_cpu_seconds(pid) for pid in pids(index, name)) - before[name]
        costs[name] = {"rss_mib": round(sum(_rss_bytes(pid) for pid in pids(index, name)) / 2**20, 1),
                       "idle_cpu_percent": round(100 * cpu / IDLE_S, 1)}
    return costs


def node_loss(core: kubernetes.client.CoreV1Api, custom: kubernetes.client.CustomObjectsApi, state_dir: Path,
              namespace: str, nodes: list[str]) -> dict[str, Any]:
    """A FaSTPod of ``2 * len(nodes)`` half-GPU pods spread over the nodes (two on each); the last
    node powered off; the time until every pod it held is replaced and Running elsewhere."""
    replicas = 2 * len(nodes)
    custom.create_namespaced_custom_object(keys.API_GROUP, "v1", namespace, keys.FASTPOD_PLURAL, {
        "apiVersion": keys.FASTPOD_API_VERSION, "kind": keys.FASTPOD_KIND,
        "metadata": {"name": "spread", "annotations": {**HALF_GPU, keys.SCHEDULING_POLICY_ANNOTATION: "spread"}},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "spread"}},
                 "podSpec": {"terminationGracePeriodSeconds": 0,
                             "containers": [{"name": "c", "image": TENANT_IMAGE_SHORT,
                                             "command": ["sh", "-c", "sleep 3600"]}]}}})

    def live() -> list[Any]:
        pods: list[Any] = core.list_namespaced_pod(namespace, label_selector=f"{keys.FASTPOD_NAME_LABEL}=spread").items
        return [p for p in pods if not p.metadata.deletion_timestamp]

    def ready(node: Any) -> bool:
        return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)

    def all_running(pods: list[Any]) -> bool:
        return len(pods) == replicas and all(p.status.container_statuses and
                                             all(c.state.running for c in p.status.container_statuses) for p in pods)

    deadline = time.monotonic() + 300
    while not all_running(live()) and time.monotonic() < deadline:
        time.sleep(0.1)
    victim = nodes[-1]
    doomed = {p.metadata.uid for p in live() if p.spec.node_name == victim}
    started = time.monotonic()
    cluster.power_off(state_dir, victim, say=lambda _text: None)
    seen_not_ready = None
    while time.monotonic() < started + 300:
        pods = live()
        if seen_not_ready is None and not ready(core.read_node(victim)):
            seen_not_ready = time.monotonic() - started
        if all_running(pods) and not {p.metadata.uid for p in pods} & doomed:
            break
        time.sleep(0.1)
    else:
        raise RuntimeError(f"the pods of {victim} were not replaced within 300 s")
    replaced_s = time.monotonic() - started
    cluster.power_on(state_dir, victim, say=lambda _text: None)
    return {"node": victim, "pods_lost": len(doomed), "node_not_ready_s": round(seen_not_ready or 0, 1),
            "replacements_running_s": round(replaced_s, 1),
            "timeouts": {"lease_s": cluster.NODE_LEASE_SECONDS, "grace": cluster.NODE_MONITOR_GRACE,
                         "toleration_s": cluster.NODE_LOSS_TOLERATION_SECONDS}}


def timed(action: Callable[[], object]) -> float:
    started = time.monotonic()
    action()
    return round(time.monotonic() - started, 2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=10, help="pods per phase (default: %(default)s)")
    parser.add_argument("--nodes", type=int, default=1, help="nodes of the cluster (default: %(default)s)")
    parser.add_argument("--state-dir", type=Path, default=None, help="default: a temporary directory")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print(json.dumps({"error": "needs root (it starts a kubelet)"}))
        return 1
    state_dir = args.state_dir or Path(tempfile.mkdtemp(prefix="fgs-bench-node-"))
    result: dict[str, Any] = {"benchmark": "real_node", "pods_per_phase": args.pods, "nodes": args.nodes}
    running: list[cluster.Cluster] = []
    try:
        result["up_s"] = timed(lambda: running.append(cluster.up(Options(state_dir=state_dir, nodes=args.nodes,
                                                                          say=lambda _text: None))))
    except ClusterError as error:
        print(json.dumps({"error": str(error)}))
        return 1
    failed = True
    try:
        with running[0].api_client() as api:
            core = kubernetes.client.CoreV1Api(api)
            core.create_namespace(kubernetes.client.V1Namespace(
                metadata=kubernetes.client.V1ObjectMeta(name="bench")))
            result["plain_pod_start"] = sequential(core, "bench", args.pods, gpu=False)
            result["gpu_pod_start"] = sequential(core, "bench", args.pods, gpu=True)
            result["gpu_pod_burst"] = burst(core, "bench", args.pods)
            if args.nodes > 1:
                nodes = running[0].node_names
                result["node_costs"] = node_costs(state_dir, nodes)
                extra = [result["node_costs"][name] for name in nodes[1:]]
                result["extra_node"] = {key: round(statistics.mean(cost[key] for cost in extra), 1)
                                        for key in ("rss_mib", "idle_cpu_percent")}
                result["node_loss"] = node_loss(core, kubernetes.client.CustomObjectsApi(api), state_dir, "bench",
                                                nodes)
        failed = False
    finally:
        result["down_s"] = timed(lambda: cluster.down(state_dir, say=lambda _text: None, keep_logs=failed))
        if failed:
            print(f"logs kept in {state_dir / 'logs'}", file=sys.stderr)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
