"""FaSTPod controller vs kube-controller-manager's ReplicaSet controller (prints one JSON object).

Against the cluster tier's real etcd + kube-apiserver v1.20, in one run:

1. ``fastgshare-controller`` (a process, leader election off) and N FaSTPods × R replicas;
2. kube-controller-manager running only its ``replicaset`` controller, with its default client
   rate limit (``--kube-api-qps=20 --kube-api-burst=30``, what clusters run), and N ReplicaSets × R;
3. the same with the rate limit lifted (``--kube-api-qps=1000``), the controllers' own speed.

Phases 1 and 3 run ``--rounds`` times (default 3), alternating, each in fresh namespaces: on two
shared cores one pair's ratio moved between 1.3 and 1.7 from run to run. The ratio reported
against the unthrottled controller is the median of the rounds' ratios, and
``fastpod_controller`` and ``replicaset_controller_unthrottled`` are that median round's phases;
every round is listed under ``rounds``.

Each phase has its own namespace and starts once the controller's caches are synced; the clock
runs from the first create of a parent object until a watch has seen all N × R pods. No scheduler
runs, so pods stay Pending: the figure is the controller's work alone. Also reported: the CPU
seconds each controller process, and the kube-apiserver, spent in its phase: on 2 shared cores
the API server's work for a controller's requests (JSON from a Python client, custom resources)
is part of that controller's time. Run: ``python -m bench.controller``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import kubernetes.client
import yaml
from kubernetes.watch.watch import iter_resp_lines

from bench.cpu import process_cpu_seconds
from fastgshare import keys
from fastgshare_cluster import controlplane
from fastgshare_cluster import processes as process_control
from fastgshare_cluster.controlplane import Binaries, ControlPlane
from fastgshare_cluster.processes import ManagedProcess, ProcessSet, wait_until

CRD_FILE = Path(__file__).resolve().parents[1] / "deploy" / "crd" / "fastpods.yaml"
SHARE = {keys.GPU_QUOTA_REQUEST: "0.2", keys.GPU_QUOTA_LIMIT: "0.5", keys.GPU_SM_PARTITION: "20",
         keys.GPU_MEM: "1Gi"}
CONTAINER = {"name": "server", "image": "registry.invalid/bench:1"}


@attrs.frozen(kw_only=True)
class Settings:
    parents: int
    replicas: int
    workers: int
    unthrottled: bool
    timeout_s: float
    rounds: int = 1


class PodCounter:
    """Watches a namespace's pods and notes when ``target`` distinct pods have been seen."""

    def __init__(self, api: kubernetes.client.ApiClient, namespace: str, target: int) -> None:
        self._core = kubernetes.client.CoreV1Api(api)
        self._namespace, self._target = namespace, target
        self._seen: set[str] = set()
        self.done_at: float | None = None
        self._ready = threading.Event()
        self._finished = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(30)

    def wait(self, timeout_s: float) -> float:
        if not self._finished.wait(timeout_s):
            raise TimeoutError(f"saw {len(self._seen)} of {self._target} pods in {self._namespace} "
                               f"after {timeout_s:.0f}s")
        assert self.done_at is not None
        return self.done_at

    def _run(self) -> None:
        raw: Any = self._core.list_namespaced_pod(self._namespace, _preload_content=False)
        listing = json.loads(raw.data)
        response: Any = self._core.list_namespaced_pod(
            self._namespace, watch=True, resource_version=listing["metadata"]["resourceVersion"],
            timeout_seconds=600, _preload_content=False)
        self._ready.set()
        for line in iter_resp_lines(response):
            event = json.loads(line)
            if event["type"] == "ADDED":
                self._seen.add(event["object"]["metadata"]["uid"])
                if len(self._seen) >= self._target:
                    self.done_at = time.monotonic()
                    self._finished.set()
                    response.close()
                    return


def cpu_seconds(process: ManagedProcess) -> float:
    return process_cpu_seconds(process.pid)


def fastpod(name: str, replicas: int) -> dict[str, Any]:
    return {"apiVersion": keys.FASTPOD_API_VERSION, "kind": keys.FASTPOD_KIND,
            "metadata": {"name": name, "annotations": SHARE},
            "spec": {"replicas": replicas, "podSpec": {"containers": [CONTAINER]}}}


def replica_set(name: str, replicas: int) -> dict[str, Any]:
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": {"containers": [CONTAINER]}}}}


def timed_phase(api: kubernetes.client.ApiClient, namespace: str, settings: Settings, *,
                create: Callable[[int], object], process: ManagedProcess,
                server: ManagedProcess | None = None) -> dict[str, Any]:
    """Create the parent objects and time until all their pods exist; with ``server`` (the
    kube-apiserver) also the CPU seconds it spent meanwhile."""
    parents, replicas = settings.parents, settings.replicas
    counter = PodCounter(api, namespace, parents * replicas)
    counter.start()
    cpu_before = cpu_seconds(process)
    server_before = cpu_seconds(server) if server is not None else 0.0
    started = time.monotonic()
    for index in range(parents):
        create(index)
    created = time.monotonic()
    done = counter.wait(settings.timeout_s)
    process.check_running()
    result = {"seconds_to_all_pods": round(done - started, 3), "seconds_to_create_parents": round(created - started, 3),
              "pods_per_second": round(parents * replicas / (done - started), 1),
              "controller_cpu_seconds": round(cpu_seconds(process) - cpu_before, 2)}
    if server is not None:
        result["apiserver_cpu_seconds"] = round(cpu_seconds(server) - server_before, 2)
    return result


def start_fastpod_controller(plane: ControlPlane, namespace: str, workers: int, workdir: Path,
                             processes: ProcessSet) -> ManagedProcess:
    log = workdir / "fastgshare-controller.log"
    process = processes.start("fastgshare-controller", [
        sys.executable, "-m", "fastpod_crd_controller", "--kubeconfig", str(plane.kubeconfig), "--namespace",
        namespace, "--no-leader-elect", "--workers", str(workers)], log)
    wait_until(lambda: "caches synced" in log.read_text(), what="the FaSTPod controller's caches", timeout_s=60,
               watched=process)
    return process


def start_replicaset_controller(binaries: Binaries, plane: ControlPlane, qps: int | None, workdir: Path,
                                processes: ProcessSet) -> ManagedProcess:
    """kube-controller-manager with only the ReplicaSet controller (``qps`` None: its defaults)."""
    workdir.mkdir(parents=True, exist_ok=True)
    (port,) = process_control.free_ports(1)
    limits = [f"--kube-api-qps={qps}", f"--kube-api-burst={qps}"] if qps else []
    process = processes.start("kube-controller-manager", [
        str(binaries.kube_controller_manager), f"--kubeconfig={plane.kubeconfig}",
        f"--authentication-kubeconfig={plane.kubeconfig}", f"--authorization-kubeconfig={plane.kubeconfig}",
        f"--bind-address={process_control.LOOPBACK}", f"--secure-port={port}", f"--cert-dir={workdir / 'certs'}",
        "--port=0", "--leader-elect=false", "--controllers=replicaset", "--use-service-account-credentials=false",
        *limits], workdir / "kube-controller-manager.log")
    wait_until(lambda: process_control.http_ok(f"https://{process_control.LOOPBACK}:{port}/healthz"),
               what="kube-controller-manager /healthz", timeout_s=90, watched=process)
    time.sleep(2)  # its informers sync right after /healthz answers
    return process


def run(settings: Settings) -> dict[str, Any]:
    binaries = controlplane.find_binaries()
    processes = ProcessSet()
    process_control.install_emergency_cleanup()
    with tempfile.TemporaryDirectory(prefix="fgs-bench-controller-") as directory:
        workdir = Path(directory)
        try:
            plane = controlplane.start_control_plane(binaries, workdir / "plane", processes)
            with plane.api_client() as api:
                return _phases(api, plane, binaries, workdir=workdir, processes=processes, settings=settings)
        finally:
            processes.stop_all()


def _phases(api: kubernetes.client.ApiClient, plane: ControlPlane, binaries: Binaries, *, workdir: Path,
            processes: ProcessSet, settings: Settings) -> dict[str, Any]:
    kubernetes.client.ApiextensionsV1Api(api).create_custom_resource_definition(yaml.safe_load(CRD_FILE.read_text()))
    time.sleep(2)  # Established
    result: dict[str, Any] = {"parents": settings.parents, "replicas": settings.replicas,
                              "pods": settings.parents * settings.replicas}
    server = processes.get("kube-apiserver")
    rounds: list[dict[str, Any]] = []
    for number in range(settings.rounds):
        ours = _fastpod_phase(api, plane, workdir=workdir / f"round-{number}", namespace=f"bench-fastpods-{number}",
                              processes=processes, settings=settings, server=server)
        if number == 0:  # the default client limit bounds it far below the others: once is enough
            result["replicaset_controller"] = _replicaset_phase(
                api, plane, binaries, workdir=workdir / "replicaset", namespace="bench-rs", qps=None,
                processes=processes, settings=settings, server=server)
        if not settings.unthrottled:
            rounds.append({"fastpod_controller": ours})
            break
        theirs = _replicaset_phase(api, plane, binaries, workdir=workdir / f"round-{number}",
                                   namespace=f"bench-rs-fast-{number}", qps=1000, processes=processes,
                                   settings=settings, server=server)
        rounds.append({"fastpod_controller": ours, "replicaset_controller_unthrottled": theirs,
                       "ratio": round(ours["seconds_to_all_pods"] / theirs["seconds_to_all_pods"], 3)})
    median = sorted(rounds, key=lambda entry: entry.get("ratio", 0))[(len(rounds) - 1) // 2]
    result.update({key: value for key, value in median.items() if key != "ratio"})
    ours_s = result["fastpod_controller"]["seconds_to_all_pods"]
    result["ratio_fastpod_to_replicaset"] = round(ours_s / result["replicaset_controller"]["seconds_to_all_pods"], 3)
    if settings.unthrottled:
        result["ratio_fastpod_to_replicaset_unthrottled"] = median["ratio"]
        result["rounds"] = [{"fastpod_s": entry["fastpod_controller"]["seconds_to_all_pods"],
                             "replicaset_unthrottled_s": entry["replicaset_controller_unthrottled"][
                                 "seconds_to_all_pods"], "ratio": entry["ratio"]} for entry in rounds]
    return result


def _fastpod_phase(api: kubernetes.client.ApiClient, plane: ControlPlane, *, workdir: Path, processes: ProcessSet,
                   settings: Settings, server: ManagedProcess | None, namespace: str) -> dict[str, Any]:
    custom = kubernetes.client.CustomObjectsApi(api)
    _create_namespace(api, namespace)

    def create_fastpod(index: int) -> object:
        return custom.create_namespaced_custom_object(keys.FASTPOD_GROUP, keys.FASTPOD_VERSION, namespace,
                                                      keys.FASTPOD_PLURAL, fastpod(f"f{index}", settings.replicas))

    workdir.mkdir(parents=True, exist_ok=True)
    ours = start_fastpod_controller(plane, namespace, settings.workers, workdir, processes)
    try:
        return {"workers": settings.workers, **timed_phase(api, namespace, settings, create=create_fastpod,
                                                           process=ours, server=server)}
    finally:
        ours.stop()


def _replicaset_phase(api: kubernetes.client.ApiClient, plane: ControlPlane, binaries: Binaries, *, workdir: Path,
                      processes: ProcessSet, settings: Settings, server: ManagedProcess | None, namespace: str,
                      qps: int | None) -> dict[str, Any]:
    apps: Any = kubernetes.client.AppsV1Api(api)  # takes plain dicts as bodies
    _create_namespace(api, namespace)
    manager = start_replicaset_controller(binaries, plane, qps, workdir / namespace, processes)

    def create_replica_set(index: int) -> object:
        return apps.create_namespaced_replica_set(namespace, replica_set(f"r{index}", settings.replicas))

    try:
        return {"kube_api_qps": qps or 20, "kube_api_burst": qps or 30, **timed_phase(
            api, namespace, settings, create=create_replica_set, process=manager, server=server)}
    finally:
        manager.stop()


def _create_namespace(api: kubernetes.client.ApiClient, name: str) -> None:
    kubernetes.client.CoreV1Api(api).create_namespace(
        kubernetes.client.V1Namespace(metadata=kubernetes.client.V1ObjectMeta(name=name)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.controller", description=__doc__.split("\n\n")[0])
    parser.add_argument("--parents", type=int, default=100, help="FaSTPods, and ReplicaSets (default: %(default)s)")
    parser.add_argument("--replicas", type=int, default=5, help="pods of each (default: %(default)s)")
    parser.add_argument("--workers", type=int, default=4, help="the FaSTPod controller's --workers "
                                                               "(default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the FaSTPod and the unthrottled "
                        "ReplicaSet phase; the median ratio is reported (default: %(default)s)")
    parser.add_argument("--no-unthrottled", action="store_true",
                        help="skip the ReplicaSet phase with the client rate limit lifted")
    parser.add_argument("--timeout-seconds", type=float, default=300.0)
    args = parser.parse_args(argv)
    try:
        result = run(Settings(parents=args.parents, replicas=args.replicas, workers=args.workers,
                              unthrottled=not args.no_unthrottled, timeout_s=args.timeout_seconds,
                              rounds=args.rounds))
    except controlplane.ClusterUnavailable as error:
        print(json.dumps({"error": f"cluster tier unavailable: {error}"}))
        return 2
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
