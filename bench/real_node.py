"""A whole cluster on this machine: how fast it comes up and goes down, and how fast pods start
(prints one JSON object). Needs root and the binaries of ``make control-plane``.

In one run, side by side:

1. ``fastgshare cluster up`` (the library call) until the node is schedulable with vGPU capacity;
2. plain pods (default scheduler, no GPU), created one after another: create -> Running;
3. GPU pods through the ``fastgshare-scheduler`` profile and our extender (assignment, bind,
   kubelet's Allocate), one after another, and then a burst created at once;
4. ``down``.

Pods are not deleted between phases: kubelet v1.20's device manager can panic when a pod is
force-deleted while the next is admitted (kubernetes#103838, fixed in 1.24), which would stall
the measurement rather than measure anything of ours.

Run: ``python -m bench.real_node [--pods N] [--state-dir DIR]``.
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


def timed(action: Callable[[], object]) -> float:
    started = time.monotonic()
    action()
    return round(time.monotonic() - started, 2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=10, help="pods per phase (default: %(default)s)")
    parser.add_argument("--state-dir", type=Path, default=None, help="default: a temporary directory")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print(json.dumps({"error": "needs root (it starts a kubelet)"}))
        return 1
    state_dir = args.state_dir or Path(tempfile.mkdtemp(prefix="fgs-bench-node-"))
    result: dict[str, Any] = {"benchmark": "real_node", "pods_per_phase": args.pods}
    running: list[cluster.Cluster] = []
    try:
        result["up_s"] = timed(lambda: running.append(cluster.up(Options(state_dir=state_dir,
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
        failed = False
    finally:
        result["down_s"] = timed(lambda: cluster.down(state_dir, say=lambda _text: None, keep_logs=failed))
        if failed:
            print(f"logs kept in {state_dir / 'logs'}", file=sys.stderr)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
