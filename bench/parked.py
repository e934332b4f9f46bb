"""The first response from zero on a real node: a parked pod against a cold start (prints one JSON
object). Needs root and the binaries of ``make control-plane``.

On one ``fastgshare cluster up`` node, two FaSTFuncs of policy ``rpr`` run the fake-fn with a model
that takes ``--load-ms`` (default 3000) to load (``FAKE_FN_LOAD_MS``: after the GPU context and its
memory, before it listens; it stands for reading weights and copying them to the GPU) and 2 ms of
GPU time per request, both with ``minReplicas: 0``:

- ``parked-fn`` keeps ``parked: 1``: idle, its pod stays with time quota 0/0 and its model loaded;
- ``cold-fn`` keeps nothing: idle, its pod is deleted.

Each *cold episode* waits until the function is at zero (``parked-fn``: its one pod ready with a
signed assignment of limit 0; ``cold-fn``: no pod left), then times one request through the gateway
from the moment it is sent to its answer. The functions run one after the other, each alone on the
node (the first is deleted before the second is made), so that neither's pod starts and deletions
load the node during the other's requests. Each episode waits out the autoscaler's 10 s rate window
and the 3 s scale-down delay, so a run takes about 10 minutes.

Run: ``python -m bench.parked [--episodes 20] [--load-ms 3000] [--state-dir DIR] [--keep-logs]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import kubernetes.client

from fastgshare import keys
from fastgshare.codec import decode_assignment
from fastgshare.profile import Profile, ProfilePoint, Slo, encode_profile
from fastgshare_cluster import cluster
from fastgshare_cluster.cluster import ClusterError, Options
from fastgshare_cluster.images import FAKE_FN_IMAGE_SHORT

NAMESPACE = keys.DEFAULT_FUNCTION_NAMESPACE
FUNCTIONS = {"parked-fn": 1, "cold-fn": 0}  # name -> spec.scaling.parked
TARGET_MEDIAN_MS = 100.0  # issue 39: the first response from zero with a parked pod
MiB = 1 << 20


def profile(name: str) -> Profile:
    point = ProfilePoint(quota_request=0.4, quota_limit=0.4, sm_partition=40, memory_bytes=128 * MiB, max_rps=50,
                         slo_rps=50, p50_ms=60, p95_ms=120, p99_ms=150)
    return Profile(function=name, slo=Slo(percentile=95, latency_ms=500), points=(point,))


def fastfunc(name: str, parked: int, load_ms: int) -> dict[str, Any]:
    env = {"FAKE_FN_GPU_MS": "2", "FAKE_FN_LOAD_MS": str(load_ms), "FAKE_FN_MEMORY": "64Mi"}
    return {"apiVersion": keys.FASTFUNC_API_VERSION, "kind": keys.FASTFUNC_KIND, "metadata": {"name": name},
            "spec": {"podSpec": {"terminationGracePeriodSeconds": 1, "containers": [{
                         "name": "fn", "image": FAKE_FN_IMAGE_SHORT, "imagePullPolicy": "IfNotPresent",
                         "ports": [{"containerPort": keys.FUNCTION_PORT}],
                         "readinessProbe": {"httpGet": {"path": "/_/health", "port": keys.FUNCTION_PORT},
                                            "periodSeconds": 1},
                         "env": [{"name": key, "value": value} for key, value in env.items()]}]},
                     "memory": "128Mi", "slo": {"latencyMs": 500, "percentile": 95},
                     "profile": {"configMapRef": {"name": f"{name}-profile"}},
                     "scaling": {"policy": "rpr", "minReplicas": 0, "maxReplicas": 2, "parked": parked,
                                 "intervalSeconds": 1, "scaleDownDelaySeconds": 3}}}


def _ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def at_zero(core: kubernetes.client.CoreV1Api, name: str, parked: bool) -> bool:
    """Whether ``name`` serves nothing: its one pod parked on the node (and ready), or no pod at all."""
    every: list[Any] = core.list_namespaced_pod(NAMESPACE, label_selector=f"{keys.FUNCTION_LABEL}={name}").items
    if not parked:
        return not every  # not even one terminating: the gateway has no endpoint left
    pods = [pod for pod in every if pod.metadata.deletion_timestamp is None]
    if len(pods) != 1 or not _ready(pods[0]):
        return False
    text = (pods[0].metadata.annotations or {}).get(keys.POD_ASSIGNMENT_ANNOTATION)
    return text is not None and decode_assignment(text).share.limit_permille == 0


def wait_at_zero(core: kubernetes.client.CoreV1Api, name: str, parked: bool, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not at_zero(core, name, parked):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} not at zero within {timeout_s:.0f}s")
        time.sleep(0.1)


def request(url: str) -> tuple[int, float, str]:
    """One POST: (status, milliseconds to the whole answer, the pod that answered)."""
    started = time.monotonic()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=b"x", method="POST"), timeout=120) as answer:
            body, status = answer.read(), answer.status
    except urllib.error.HTTPError as error:
        body, status = error.read(), error.code
    elapsed_ms = (time.monotonic() - started) * 1000
    try:
        pod = str(json.loads(body).get("pod", ""))
    except ValueError:
        pod = ""
    return status, elapsed_ms, pod


def summary(latencies_ms: list[float]) -> dict[str, float]:
    ordered = sorted(latencies_ms)
    p95 = ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]  # nearest rank
    return {"count": len(ordered), "median_ms": round(statistics.median(ordered), 1), "p95_ms": round(p95, 1),
            "min_ms": round(ordered[0], 1), "max_ms": round(ordered[-1], 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=20, help="cold episodes per function (default: %(default)s)")
    parser.add_argument("--load-ms", type=int, default=3000, help="the model's load time (default: %(default)s)")
    parser.add_argument("--state-dir", type=Path, default=None, help="default: a temporary directory")
    parser.add_argument("--keep-logs", action="store_true", help="keep the components' logs in the state dir")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print(json.dumps({"error": "needs root (it starts a kubelet)"}))
        return 1
    state_dir = args.state_dir or Path(tempfile.mkdtemp(prefix="fgs-bench-parked-"))
    result: dict[str, Any] = {"benchmark": "parked", "episodes": args.episodes, "model_load_ms": args.load_ms,
                              "gpu_ms_per_request": 2, "scale_down_delay_s": 3, "interval_s": 1}
    try:
        running = cluster.up(Options(state_dir=state_dir, say=lambda _text: None))
    except ClusterError as error:
        print(json.dumps({"error": str(error)}))
        return 1
    failed = True
    try:
        with running.api_client() as api:
            core = kubernetes.client.CoreV1Api(api)
            custom = kubernetes.client.CustomObjectsApi(api)
            for name, parked in FUNCTIONS.items():
                configmap: Any = {"metadata": {"name": f"{name}-profile"},
                                  "data": {"profile.json": encode_profile(profile(name))}}
                core.create_namespaced_config_map(NAMESPACE, configmap)
                custom.create_namespaced_custom_object(keys.FASTFUNC_GROUP, keys.FASTFUNC_VERSION, NAMESPACE,
                                                       keys.FASTFUNC_PLURAL, fastfunc(name, parked, args.load_ms))
                answers = []
                for _ in range(args.episodes):
                    wait_at_zero(core, name, bool(parked))
                    answers.append(request(f"{running.gateway_url}/function/{name}"))
                custom.delete_namespaced_custom_object(keys.FASTFUNC_GROUP, keys.FASTFUNC_VERSION, NAMESPACE,
                                                       keys.FASTFUNC_PLURAL, name)
                wait_at_zero(core, name, parked=False)  # its pods gone before the next function starts
                result["parked" if parked else "cold_start"] = {
                    "function": name, **summary([ms for _, ms, _ in answers]),
                    "failed": sum(1 for status, _, _ in answers if status != 200),
                    "pods_that_answered": len({pod for _, _, pod in answers}),
                }
        parked_median = result["parked"]["median_ms"]
        result["target"] = {"median_ms_with_a_parked_pod": TARGET_MEDIAN_MS,
                            "met": parked_median <= TARGET_MEDIAN_MS}
        result["cold_over_parked_median"] = round(result["cold_start"]["median_ms"] / max(parked_median, 0.1), 1)
        failed = False
    finally:
        cluster.down(state_dir, say=lambda _text: None, keep_logs=failed or args.keep_logs)
        if failed or args.keep_logs:
            print(f"logs kept in {state_dir / 'logs'}", file=sys.stderr)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
