"""Pods scheduled per second: the real kube-scheduler with our extender vs without it (one JSON object).

One run of the cluster tier's binaries (etcd, kube-apiserver and kube-scheduler v1.20.2):
200 fake GPU nodes of 8 GPUs, each advertising both ``fastgshare.caps.in.tum/vgpu`` (16 slots
per GPU) and a plain extended resource ``bench.fastgshare/gpu`` (8). Then, twice, 1,000 pods
are created while no scheduler runs, a scheduler is started, and a watch records when each pod
is bound:

- ``plain``: the default profile, pods requesting ``bench.fastgshare/gpu: 1``;
- ``extender``: the shipped ``fastgshare-scheduler`` configuration with the extender (its real
  command), pods requesting ``fastgshare.caps.in.tum/vgpu: 1`` with one of four shares;
- ``plain_unthrottled``: as ``plain``, with the scheduler's API client rate limit (50 QPS,
  burst 100 by default, and the bound of ``plain``'s binds) lifted. The extender binds with its
  own client, so that limit does not bound the ``extender`` phase.
- ``extender_without_agent_marks``: the ``extender`` phase with no stand-in node agent and
  ``--bind-wait-seconds 0`` (no window: nothing would mark the pods it waits for), so the agent's
  write a pod and its CPU are out of the measure: what the extender and its bind cost alone;
- ``null_extender`` and ``null_extender_binding``: the ``extender`` phase's pods and scheduler
  configuration (client limits lifted) with :mod:`bench.null_extender` instead of ours: the
  protocol's floor, when the scheduler binds and when the extender binds with one API call a pod;
- ``null_extender_choosing`` and ``null_extender_choosing_recording``: the floor of a design
  without the bind verb, where ``/filter`` makes the choice (passes one node), no prioritize
  verb is called and the scheduler binds; the second also writes the choice onto each pod with
  one merge patch of the extender's own, off the scheduling path, and its rate runs until the
  last pod carries its choice (the binds' own rate is ``binds_per_s``);
- ``null_extender_binding_marking`` and ``null_extender_choosing_recording_marking``: the floors
  of the writes our product makes for each pod, with either design: the two phases above, with
  the stand-in node agent marking each pod once its choice is on it, as the ``extender`` phase
  has it (the agent's mark is the product's write too, see ``device_plugin/servicer.py``). They
  run until the last pod is bound and carries its choice, as the ``extender`` phase runs until the
  last bind: the last marks are not waited for.

Throughput is (pods - 1) / (last bind - first bind), so start-up is not counted. Each phase also
reports ``cpu_seconds`` until its last bind: of the API server, etcd, the extender (ours or the
null one), the scheduler (from its start) and the whole ``machine``: on two shared cores, where the
CPU goes is what bounds the rates. No kubelet
runs: a stand-in marks bound pods allocated as the node agents would (one more write a pod). The
extender runs with its defaults: a bind waits its turn only when 8 pods of its node wait for the
agent (``--bind-window 8 --bind-wait-seconds 5``).

Needs the binaries from ``tests/cluster/build-control-plane.sh``. Run:
``python -m bench.scheduling_throughput [--nodes 200] [--pods 1000] [--policy binpack]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kubernetes.client
from kubernetes.watch.watch import iter_resp_lines

from bench.cpu import machine_busy_seconds, process_cpu_seconds
from bench.extender_harness import (
    AllocationMarker,
    ExtenderProcess,
    raw_core_api,
    scheduler_config,
)
from bench.null_extender import RECORD_ANNOTATION
from fastgshare import keys
from fastgshare.codec import encode_node_inventory
from fastgshare.inventory import GpuDevice, NodeInventory
from fastgshare.share import ShareSpec, share_annotations
from fastgshare_cluster import controlplane
from fastgshare_cluster import processes as process_control
from scheduler_extender.config import DEFAULT_BIND_WAIT_S

PLAIN_RESOURCE = "bench.fastgshare/gpu"
# The scheduler's API client is rate-limited to 50 requests/s (burst 100) by default, which is
# what bounds the plain scheduler's binds; this variant lifts the limit to show its raw speed.
UNTHROTTLED = {"qps": 5000, "burst": 10000}
GPUS_PER_NODE = 8
GiB = 2**30
SHARES = (
    ShareSpec(request_permille=200, limit_permille=400, sm_percent=40, memory_bytes=2 * GiB),
    ShareSpec(request_permille=300, limit_permille=300, sm_percent=30, memory_bytes=1 * GiB),
    ShareSpec(request_permille=100, limit_permille=500, sm_percent=20, memory_bytes=1 * GiB),
    ShareSpec(request_permille=250, limit_permille=500, sm_percent=50, memory_bytes=2 * GiB),
)


def make_node(core: Any, name: str) -> None:
    """A Ready, untainted node with the node agent's inventory and both resources (as the cluster
    tier's ``make_gpu_node`` does, plus the plain resource)."""
    gpus = tuple(GpuDevice(uuid=f"GPU-{name}-{i}", index=i, model="Tesla V100", memory_bytes=16 * GiB, sm_count=80,
                           mps_enabled=True) for i in range(GPUS_PER_NODE))
    inventory = NodeInventory(node_name=name, gpus=gpus)
    core.create_node({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name},
                                   "annotations": {keys.NODE_GPU_INFO_ANNOTATION: encode_node_inventory(inventory)}}})
    resources = {"cpu": "64", "memory": "256Gi", "pods": "250", keys.VGPU_RESOURCE: str(inventory.advertised_slots),
                 PLAIN_RESOURCE: str(GPUS_PER_NODE)}
    now = datetime.now(UTC).replace(microsecond=0).isoformat()
    core.patch_node_status(name, {"status": {"capacity": resources, "allocatable": resources, "conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "benchmark node",
         "lastHeartbeatTime": now, "lastTransitionTime": now}]}})
    core.patch_node(name, [{"op": "add", "path": "/spec/taints", "value": []}])  # the API server's not-ready taint


def make_nodes(api: kubernetes.client.ApiClient, count: int) -> list[str]:
    core = raw_core_api(api)
    names = [f"bench-node-{i:04d}" for i in range(count)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda name: make_node(core, name), names))
    return names


def pod(name: str, *, extender: bool, serial: int) -> dict[str, object]:
    resource = keys.VGPU_RESOURCE if extender else PLAIN_RESOURCE
    metadata: dict[str, object] = {"name": name}
    if extender:
        metadata["annotations"] = share_annotations(SHARES[serial % len(SHARES)])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": {
        "schedulerName": keys.SCHEDULER_NAME if extender else "default-scheduler",
        "containers": [{"name": "main", "image": "registry.invalid/none:0",
                        "resources": {"limits": {resource: "1"}, "requests": {"cpu": "10m"}}}]}}


class BindTimes:
    """Watches a namespace and records when each pod is first seen bound (and, with ``annotation``,
    first seen carrying that annotation).

    If the watch fails or expires, a fresh list picks up the pods bound meanwhile (timed at the
    list, a little late); ``relists`` counts how often that happened.
    """

    def __init__(self, api: kubernetes.client.ApiClient, namespace: str, annotation: str = "") -> None:
        self._core = raw_core_api(api)
        self._namespace = namespace
        self._annotation = annotation
        self.bound: dict[str, float] = {}
        self.annotated: dict[str, float] = {}
        self.relists = -1
        self._stop = threading.Event()
        self._version = self._relist()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _relist(self) -> str:
        self.relists += 1
        listing = json.loads(self._core.list_namespaced_pod(self._namespace, _preload_content=False).data)
        for item in listing["items"]:
            self._seen(item)
        return str(listing["metadata"]["resourceVersion"])

    def _seen(self, pod: dict[str, Any]) -> None:
        if pod.get("spec", {}).get("nodeName"):
            self.bound.setdefault(pod["metadata"]["name"], time.monotonic())
        if self._annotation and self._annotation in (pod["metadata"].get("annotations") or {}):
            self.annotated.setdefault(pod["metadata"]["name"], time.monotonic())

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._watch()
            except Exception:  # an expired or broken watch: list again
                self._version = self._relist()

    def _watch(self) -> None:
        response = self._core.list_namespaced_pod(self._namespace, watch=True, resource_version=self._version,
                                                  timeout_seconds=10, _preload_content=False)
        try:
            for line in iter_resp_lines(response):
                event = json.loads(line)
                if event["type"] == "ERROR":
                    raise RuntimeError(f"watch ended: {event['object'].get('message')}")
                self._version = event["object"]["metadata"]["resourceVersion"]
                self._seen(event["object"])
                if self._stop.is_set():
                    return
        finally:
            response.release_conn()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


def run_phase(api: kubernetes.client.ApiClient, start: Callable[[dict[str, Any]], process_control.ProcessSet],
              config: dict[str, Any], *, pods: int, extender: bool, namespace: str, timeout_s: float,
              watched: dict[str, int], annotation: str = "") -> dict[str, object]:
    """Create the pods, start a scheduler, and time the binds; with the CPU seconds each process
    of ``watched`` (name: pid), the scheduler and the whole machine spent until the last bind.
    With ``annotation``, the phase ends when every pod also carries it: ``pods_per_s`` then runs
    from the first bind to the last pod annotated (a pod is placed only once its choice is
    recorded), and so do the CPU seconds; ``binds_per_s`` is the binds' own rate."""
    core = raw_core_api(api)
    core.create_namespace({"metadata": {"name": namespace}})
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda i: core.create_namespaced_pod(namespace, pod(f"p{i:04d}", extender=extender, serial=i)),
                      range(pods)))
    times = BindTimes(api, namespace, annotation)
    before = {name: process_cpu_seconds(pid) for name, pid in watched.items()}
    machine_before = machine_busy_seconds()
    started = time.monotonic()
    scheduler = start(config)
    deadline = started + timeout_s
    while (len(times.bound) < pods or (annotation and len(times.annotated) < pods)) and time.monotonic() < deadline:
        time.sleep(0.1 if annotation else 0.5)
    cpu = {name: process_cpu_seconds(pid) - before[name] for name, pid in watched.items()}
    kube_scheduler = scheduler.get("kube-scheduler")
    if kube_scheduler is not None:
        cpu["kube-scheduler"] = process_cpu_seconds(kube_scheduler.pid)
    cpu["machine"] = machine_busy_seconds() - machine_before
    cpu_seconds = {name: round(value, 1) for name, value in cpu.items()}
    times.stop()
    scheduler.stop_all()  # before the next phase's pods exist
    core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)  # free the nodes for the next phase
    stamps = sorted(times.bound.values())
    span = stamps[-1] - stamps[0] if len(stamps) > 1 else float("nan")
    rate = round((len(stamps) - 1) / span, 1) if len(stamps) > 1 else 0.0
    result: dict[str, object] = {
        "bound": len(stamps), "pods": pods, "watch_relists": times.relists,
        "seconds_first_to_last_bind": round(span, 2),
        "seconds_from_scheduler_start": round(stamps[-1] - started, 2) if stamps else None,
        "pods_per_s": rate, "cpu_seconds": cpu_seconds}
    if annotation:
        last = max(times.annotated.values(), default=float("nan"))
        result.update({"binds_per_s": rate, "annotated": len(times.annotated),
                       "seconds_from_scheduler_start_to_last_annotated": round(last - started, 2),
                       "pods_per_s": round((len(times.annotated) - 1) / (last - stamps[0]), 1)
                       if len(times.annotated) > 1 and stamps else 0.0})
    return result


def server_side_means(url: str) -> dict[str, float]:
    """Mean time the extender spent per verb, from its own request-duration histogram."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    sums: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        for part in ("sum", "count"):
            prefix = f"fastgshare_extender_request_duration_seconds_{part}{{verb=\""
            if line.startswith(prefix):
                verb, value = line[len(prefix):].split("\"} ")
                sums.setdefault(verb, {})[part] = float(value)
    return {verb: round(1000 * v["sum"] / v["count"], 2) for verb, v in sums.items()
            if verb in ("filter", "prioritize", "bind") and v.get("count")}


def measure(nodes: int, pods: int, policy: str, timeout_s: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="fgs-bench-") as directory:
        workdir = Path(directory)
        processes = process_control.ProcessSet()
        process_control.install_emergency_cleanup()
        try:
            binaries = controlplane.find_binaries()
            plane = controlplane.start_control_plane(binaries, workdir / "cluster", processes)
            api = plane.api_client()
            made = time.monotonic()
            make_nodes(api, nodes)
            nodes_s = time.monotonic() - made
            started: list[process_control.ProcessSet] = []

            def start(config: dict[str, Any]) -> process_control.ProcessSet:
                started.append(process_control.ProcessSet())
                controlplane.start_scheduler(binaries, plane, config, workdir / f"scheduler-{len(started)}",
                                             started[-1])
                return started[-1]

            plane_pids = {name: process.pid for name in ("kube-apiserver", "etcd")
                          if (process := processes.get(name)) is not None}
            plain = run_phase(api, start, {"profiles": [{"schedulerName": "default-scheduler"}]}, pods=pods,
                              extender=False, namespace="plain", timeout_s=timeout_s, watched=plane_pids)
            unthrottled = run_phase(api, start, {"profiles": [{"schedulerName": "default-scheduler"}],
                                                 "clientConnection": UNTHROTTLED}, pods=pods, extender=False,
                                    namespace="plain-unthrottled", timeout_s=timeout_s, watched=plane_pids)
            ours = extender_phase(api, start, plane.kubeconfig, workdir, policy=policy, pods=pods,
                                  timeout_s=timeout_s, watched=plane_pids, agent_marks=True)
            unmarked = extender_phase(api, start, plane.kubeconfig, workdir, policy=policy, pods=pods,
                                      timeout_s=timeout_s, watched=plane_pids, agent_marks=False)
            floors = {name: null_phase(api, start, plane.kubeconfig, workdir, mode=mode, pods=pods,
                                       timeout_s=timeout_s, watched=plane_pids)
                      for name, mode in (("null_extender", "scheduler"), ("null_extender_binding", "binding"),
                                         ("null_extender_choosing", "choosing"),
                                         ("null_extender_choosing_recording", "choosing-recording"),
                                         ("null_extender_binding_marking", "binding-marking"),
                                         ("null_extender_choosing_recording_marking",
                                          "choosing-recording-marking"))}
            for scheduler in started:
                scheduler.stop_all()
        finally:
            processes.stop_all()
    ours_rate, plain_rate = float(str(ours["pods_per_s"])), float(str(plain["pods_per_s"]))
    ratio = round(ours_rate / plain_rate, 3) if plain_rate else None
    return {"benchmark": "scheduling_throughput", "kubernetes": "v1.20.2", "nodes": nodes,
            "gpus_per_node": GPUS_PER_NODE, "pods": pods, "node_setup_s": round(nodes_s, 1),
            "plain": plain, "extender": {"policy": policy, **ours}, "ratio_extender_to_plain": ratio,
            "plain_unthrottled": {"client_qps": UNTHROTTLED["qps"], **unthrottled},
            "ratio_extender_to_plain_unthrottled": round(ours_rate / float(str(unthrottled["pods_per_s"])), 3),
            "extender_without_agent_marks": {"policy": policy, **unmarked},
            "ratio_extender_without_agent_marks_to_plain_unthrottled": round(float(str(unmarked["pods_per_s"])) / float(
                str(unthrottled["pods_per_s"])), 3),
            **floors, **{f"ratio_{name}_to_plain_unthrottled": round(float(str(floor["pods_per_s"])) / float(str(
                unthrottled["pods_per_s"])), 3) for name, floor in floors.items()}}


def extender_phase(api: kubernetes.client.ApiClient, start: Callable[[dict[str, Any]], process_control.ProcessSet],
                   kubeconfig: Path, workdir: Path, *, policy: str, pods: int, timeout_s: float,
                   watched: dict[str, int], agent_marks: bool) -> dict[str, object]:
    """Our extender's phase: with the stand-in agent marking each bound pod and the shipped window,
    or (``agent_marks`` False) with no agent writes and binds that never wait for one."""
    (port,) = process_control.free_ports(1)
    name = "extender" if agent_marks else "extender-without-agent-marks"
    extender_process = ExtenderProcess(kubeconfig, port, workdir / f"{name}.log", policy=policy,
                                       bind_wait_s=DEFAULT_BIND_WAIT_S if agent_marks else 0.0)
    extender_process.start()
    try:
        with contextlib.ExitStack() as stack:
            marker = stack.enter_context(AllocationMarker(api, name)) if agent_marks else None
            result = run_phase(api, start, scheduler_config(extender_process.url), pods=pods, extender=True,
                               namespace=name, timeout_s=timeout_s,
                               watched={**watched, "extender": extender_process.pid})
            if marker is not None:
                result["allocations_simulated"] = marker.marked
        result["extender_mean_ms"] = server_side_means(extender_process.url)
    finally:
        extender_process.stop()
    return result


NULL_MODES = {  # mode: (the null extender's flags, the extender's verbs in the scheduler's configuration)
    "scheduler": ((), {"bindVerb": ""}),
    "binding": (("--bind",), {}),
    "choosing": (("--choose",), {"bindVerb": "", "prioritizeVerb": ""}),
    "choosing-recording": (("--choose", "--record"), {"bindVerb": "", "prioritizeVerb": ""}),
}
NULL_MODES["binding-marking"] = NULL_MODES["binding"]  # the same null extender; the phase adds the marks
NULL_MODES["choosing-recording-marking"] = NULL_MODES["choosing-recording"]


def null_phase(api: kubernetes.client.ApiClient, start: Callable[[dict[str, Any]], process_control.ProcessSet],
               kubeconfig: Path, workdir: Path, *, mode: str, pods: int, timeout_s: float,
               watched: dict[str, int], namespace: str = "") -> dict[str, object]:
    """The extender phase with :mod:`bench.null_extender` in one of :data:`NULL_MODES`."""
    flags, verbs = NULL_MODES[mode]
    (port,) = process_control.free_ports(1)
    url = f"http://127.0.0.1:{port}"
    processes = process_control.ProcessSet()
    try:
        null = processes.start("null-extender", [sys.executable, "-m", "bench.null_extender", "--listen",
                                          f"127.0.0.1:{port}", "--kubeconfig", str(kubeconfig), *flags],
                              workdir / f"null-extender-{port}.log")
        process_control.wait_until(lambda: process_control.http_ok(f"{url}/healthz"), what="the null extender",
                                timeout_s=30)
        config = scheduler_config(url, **verbs)
        config["clientConnection"] = UNTHROTTLED
        namespace = namespace or f"null-{mode}"
        with contextlib.ExitStack() as stack:
            marker = (stack.enter_context(AllocationMarker(api, namespace, assignment=RECORD_ANNOTATION))
                      if mode.endswith("-marking") else None)
            result = run_phase(api, start, config, pods=pods, extender=True, namespace=namespace,
                               timeout_s=timeout_s, watched={**watched, "null-extender": null.pid},
                               annotation=RECORD_ANNOTATION if "--record" in flags else "")
            if marker is not None:
                result["allocations_simulated"] = marker.marked
        return {"binds": "extender" if "--bind" in flags else "scheduler", "mode": mode, **result}
    finally:
        processes.stop_all()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--policy", default="binpack", choices=["binpack", "spread"])
    parser.add_argument("--timeout", type=float, default=900, help="seconds to wait for each phase's binds")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.nodes, args.pods, args.policy, args.timeout), indent=2))


if __name__ == "__main__":
    main()
