"""Real-node tier: the profile-driven autoscaler under a ramp sent through the gateway (issue 17).

A FaSTFunc of policy ``rpr`` running the fake-fn (5 ms of GPU time per request) with a profile of
two configurations; requests go through the gateway at 5, then 40, then 10 req/s (open loop). The
function controller reads the gateway's counters and scales the child FaSTPods: up within an
interval plus a pod start after the step up, down only after the scale-down delay. The share of
requests over the SLO is printed (a target, measured here, not asserted: machines are noisy).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import kubernetes.client
import pytest

from fastgshare import keys
from fastgshare.codec import decode_assignment
from fastgshare.profile import Profile, ProfilePoint, Slo, encode_profile
from fastgshare_cluster.cluster import Cluster
from fastgshare_cluster.processes import wait_until
from tests.cluster.real_node import fake_fn_pod_spec, real_node_core  # noqa: F401 - the fixture core

pytestmark = pytest.mark.realnode

NAMESPACE = keys.DEFAULT_FUNCTION_NAMESPACE
FUNCTION = "ramp"
SLO_MS = 500
MiB = 1 << 20
DELAY_S = 20


def point(quota: float, sm: int, max_rps: float, p95_ms: float = 120) -> ProfilePoint:
    """A profile point of the fake-fn (128 MiB, quota request = limit) serving ``max_rps`` within the SLO."""
    return ProfilePoint(quota_request=quota, quota_limit=quota, sm_partition=sm, memory_bytes=128 * MiB,
                        max_rps=max_rps, slo_rps=max_rps, p50_ms=p95_ms / 2, p95_ms=p95_ms, p99_ms=p95_ms * 1.2)


def profile() -> Profile:
    """Two configurations of the fake-fn at 5 ms per request, measured conservatively on this
    machine's simulated GPU (one request at a time per pod)."""
    return Profile(function=FUNCTION, slo=Slo(percentile=95, latency_ms=SLO_MS),
                   points=(point(0.2, 20, 25, 150), point(0.4, 40, 50, 120)))


@contextmanager
def autoscaled_function(real_cluster: Cluster, core: kubernetes.client.CoreV1Api, name: str, profile: Profile,
                        scaling: dict[str, Any], env: dict[str, str] | None = None) -> Iterator[str]:
    """A FaSTFunc ``name`` of the fake-fn (5 ms of GPU time per request, more settings in ``env``) with
    ``profile`` in its ConfigMap and ``spec.scaling``; deleted, and its pods waited for, afterwards."""
    settings = {"FAKE_FN_GPU_MS": "5", **(env or {})}
    custom = kubernetes.client.CustomObjectsApi(real_cluster.api_client())
    core.create_namespaced_config_map(NAMESPACE, {
        "metadata": {"name": f"{name}-profile"}, "data": {"profile.json": encode_profile(profile)}})
    custom.create_namespaced_custom_object(keys.FASTFUNC_GROUP, keys.FASTFUNC_VERSION, NAMESPACE,
                                           keys.FASTFUNC_PLURAL, {
        "apiVersion": keys.FASTFUNC_API_VERSION, "kind": keys.FASTFUNC_KIND, "metadata": {"name": name},
        "spec": {"podSpec": fake_fn_pod_spec(settings),
                 "memory": "128Mi", "slo": {"latencyMs": SLO_MS, "percentile": 95},
                 "profile": {"configMapRef": {"name": f"{name}-profile"}},
                 "scaling": {"policy": "rpr", "intervalSeconds": 2, "headroom": 0.5, **scaling}}})
    try:
        yield name
    finally:
        custom.delete_namespaced_custom_object(keys.FASTFUNC_GROUP, keys.FASTFUNC_VERSION, NAMESPACE,
                                               keys.FASTFUNC_PLURAL, name)
        core.delete_namespaced_config_map(f"{name}-profile", NAMESPACE)
        wait_until(lambda: not core.list_namespaced_pod(NAMESPACE, label_selector=f"{keys.FUNCTION_LABEL}={name}")
                   .items, what=f"the pods of {name} gone", timeout_s=120)


@pytest.fixture
def ramp_function(real_cluster: Cluster, core: kubernetes.client.CoreV1Api) -> Iterator[str]:
    with autoscaled_function(real_cluster, core, FUNCTION, profile(), {
            "minReplicas": 1, "maxReplicas": 8, "scaleDownDelaySeconds": DELAY_S}) as name:
        yield name


def ready_pods(core: kubernetes.client.CoreV1Api) -> int:
    pods = core.list_namespaced_pod(NAMESPACE, label_selector=f"{keys.FUNCTION_LABEL}={FUNCTION}").items
    return sum(1 for p in pods if p.metadata.deletion_timestamp is None and any(
        c.type == "Ready" and c.status == "True" for c in p.status.conditions or []))


class OpenLoop:
    """Requests at a set rate through the gateway, each timed from its scheduled start."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.results: list[tuple[float, int, float]] = []  # (sent at, status, latency ms)
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=64)

    def _one(self, scheduled: float) -> None:
        status = 0
        try:
            with urllib.request.urlopen(urllib.request.Request(self.url, data=b"x", method="POST"),
                                        timeout=30) as response:
                response.read()
                status = response.status
        except urllib.error.HTTPError as error:
            status = error.code
        except OSError:
            status = 599
        with self._lock:
            self.results.append((scheduled, status, (time.monotonic() - scheduled) * 1000))

    def run(self, rate: float, seconds: float) -> None:
        start = time.monotonic()
        for index in range(round(rate * seconds)):
            scheduled = start + index / rate
            time.sleep(max(0.0, scheduled - time.monotonic()))
            self._pool.submit(self._one, scheduled)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def status_of(real_cluster: Cluster, name: str = FUNCTION) -> dict[str, Any]:
    custom = kubernetes.client.CustomObjectsApi(real_cluster.api_client())
    obj = custom.get_namespaced_custom_object(keys.FASTFUNC_GROUP, keys.FASTFUNC_VERSION, NAMESPACE,
                                              keys.FASTFUNC_PLURAL, name)
    return dict(obj.get("status") or {})


def desired_pods(custom: kubernetes.client.CustomObjectsApi) -> int:
    """The pods the controller asks for: the child FaSTPods' ``spec.replicas``, summed."""
    children = custom.list_namespaced_custom_object(keys.FASTPOD_GROUP, keys.FASTPOD_VERSION, NAMESPACE,
                                                    keys.FASTPOD_PLURAL,
                                                    label_selector=f"{keys.FUNCTION_LABEL}={FUNCTION}")
    return sum(int(child["spec"].get("replicas", 0)) for child in children["items"])


class Sampler:
    """Every second: (time, desired pods) while the test runs."""

    def __init__(self, custom: kubernetes.client.CustomObjectsApi) -> None:
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(custom,), daemon=True)
        self._thread.start()

    def _run(self, custom: kubernetes.client.CustomObjectsApi) -> None:
        while not self._stop.wait(1.0):
            self.samples.append((time.monotonic(), desired_pods(custom)))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def test_a_ramp_through_the_gateway_scales_the_function_up_in_time_and_down_after_the_delay(
        real_cluster: Cluster, core: kubernetes.client.CoreV1Api, ramp_function: str) -> None:
    custom = kubernetes.client.CustomObjectsApi(real_cluster.api_client())
    wait_until(lambda: ready_pods(core) >= 1, what="the function's first pod ready", timeout_s=120)
    load = OpenLoop(f"{real_cluster.gateway_url}/function/{FUNCTION}")
    sampler = Sampler(custom)
    try:
        load.run(5, 20)  # warm: the first cold start is behind us
        one = desired_pods(custom)
        step_up = time.monotonic()
        load.run(40, 60)
        at_peak, ready_at_peak, planned = desired_pods(custom), ready_pods(core), status_of(real_cluster)
        step_down = time.monotonic()
        load.run(10, DELAY_S + 30)
        wait_until(lambda: desired_pods(custom) < at_peak, what="a scale-down after the delay", timeout_s=90)
    finally:
        load.close()
        sampler.stop()
    samples = sampler.samples
    first_up = next(t for t, n in samples if t >= step_up and n > one)
    last_up = max(t for (t, n), (_, before) in zip(samples[1:], samples, strict=False) if n > before)
    first_down = next(t for t, n in samples if t >= step_down and n < at_peak)
    results = [r for r in load.results if r[0] >= step_up]
    failed = [r for r in results if r[1] != 200]
    over = [r for r in results if r[1] != 200 or r[2] > SLO_MS]
    print(f"ramp 5 -> 40 -> 10 req/s through the gateway: pods {one} -> {at_peak} ({ready_at_peak} ready; configs "
          f"{json.dumps(planned.get('configs'))}, capacity {planned.get('capacityRps')} req/s) "
          f"{first_up - step_up:.1f}s after the step up -> fewer {first_down - last_up:.1f}s after the last scale-up "
          f"(delay {DELAY_S}s); {len(over)} of {len(results)} requests after the warm-up over the {SLO_MS} ms SLO "
          f"or failed ({100 * len(over) / max(len(results), 1):.2f} %)")
    assert one == 1
    assert at_peak > one  # 40 req/s needs more than one pod of either configuration
    assert first_up - step_up <= 30  # within an interval (2 s) and the 10 s rate window, generously
    assert float(planned.get("capacityRps") or 0) >= 40  # the ready pods' SLO capacity covers the load
    assert first_down - last_up >= DELAY_S - 1  # never before the delay (1 s: the sampling)
    assert len(failed) <= 0.02 * len(results), failed[:5]  # requests wait in the gateway's queue, not fail


VERTICAL = "raise"


@pytest.fixture
def ladder_function(real_cluster: Cluster, core: kubernetes.client.CoreV1Api) -> Iterator[str]:
    """A function whose profile has two quotas of one SM slice: a higher rate is served by raising
    the running pod's time quota (cost 0.1 -> 0.2 of a GPU for +20 req/s) rather than a new pod."""
    ladder = Profile(function=VERTICAL, slo=Slo(percentile=95, latency_ms=SLO_MS),
                     points=(point(0.2, 50, 25), point(0.4, 50, 45)))
    with autoscaled_function(real_cluster, core, VERTICAL, ladder, {
            "minReplicas": 1, "maxReplicas": 4, "scaleDownDelaySeconds": 120}) as name:
        yield name


def test_a_higher_rate_raises_the_running_pods_time_quota_in_place(
        real_cluster: Cluster, core: kubernetes.client.CoreV1Api, ladder_function: str) -> None:
    selector = f"{keys.FUNCTION_LABEL}={VERTICAL}"

    def live_pods() -> list[Any]:
        return [p for p in core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
                if p.metadata.deletion_timestamp is None]

    wait_until(lambda: any(c.type == "Ready" and c.status == "True"
                           for p in live_pods() for c in p.status.conditions or []),
               what="the function's first pod ready", timeout_s=120)
    [first] = live_pods()
    assert first.metadata.annotations[keys.GPU_QUOTA_REQUEST] == "0.2"
    load = OpenLoop(f"{real_cluster.gateway_url}/function/{VERTICAL}")
    started = time.monotonic()
    raised_at: list[float] = []

    def raised() -> bool:
        pods = live_pods()
        text = (pods[0].metadata.annotations or {}).get(keys.POD_ASSIGNMENT_ANNOTATION) if len(pods) == 1 else None
        if text is not None and decode_assignment(text).share.request_permille == 400:
            raised_at.append(time.monotonic())
            return True
        return False

    try:
        sender = threading.Thread(target=load.run, args=(20, 30), daemon=True)  # 20 req/s: 30 wanted, 25 run
        sender.start()
        wait_until(raised, what="the pod's assignment raised to quota 0.4", timeout_s=40)
        sender.join(40)
    finally:
        load.close()
    pods = live_pods()
    custom = kubernetes.client.CustomObjectsApi(real_cluster.api_client())
    children = custom.list_namespaced_custom_object(keys.FASTPOD_GROUP, keys.FASTPOD_VERSION, NAMESPACE,
                                                    keys.FASTPOD_PLURAL, label_selector=selector)["items"]
    results = load.results
    failed = [r for r in results if r[1] != 200]
    print(f"vertical step: the pod's quota 0.2 -> 0.4 in place {raised_at[0] - started:.1f}s after 20 req/s "
          f"started; {len(failed)} of {len(results)} requests failed; children "
          f"{[(c['metadata']['name'], c['metadata']['annotations'][keys.GPU_QUOTA_REQUEST]) for c in children]}")
    assert [p.metadata.uid for p in pods] == [first.metadata.uid]  # the same pod, not a new one
    assert [(c["metadata"]["name"], c["metadata"]["annotations"][keys.GPU_QUOTA_REQUEST]) for c in children] == [
        (f"{VERTICAL}-q20-s50", "0.4")]
    assert pods[0].metadata.annotations[keys.GPU_QUOTA_REQUEST] == "0.4"
    assert not failed, failed[:5]
    row = status_of(real_cluster, VERTICAL)["configs"]
    assert [r["config"] for r in row] == ["q40-s50"]



IDLE = "idle"


@pytest.fixture
def idle_function(real_cluster: Cluster, core: kubernetes.client.CoreV1Api) -> Iterator[str]:
    """A function of policy rpr with minReplicas 0 and a short scale-down delay."""
    one = Profile(function=IDLE, slo=Slo(percentile=95, latency_ms=SLO_MS), points=(point(0.2, 20, 25),))
    with autoscaled_function(real_cluster, core, IDLE, one, {
            "minReplicas": 0, "maxReplicas": 2, "scaleDownDelaySeconds": 10}) as name:
        yield name


def test_an_idle_function_scales_to_zero_and_the_next_request_wakes_it(
        real_cluster: Cluster, core: kubernetes.client.CoreV1Api, idle_function: str) -> None:
    selector = f"{keys.FUNCTION_LABEL}={IDLE}"

    def pods() -> int:
        return sum(1 for p in core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
                   if p.metadata.deletion_timestamp is None)

    url = f"{real_cluster.gateway_url}/function/{IDLE}"
    time.sleep(6)  # a few ticks without a request: nothing is planned
    assert pods() == 0

    def call() -> tuple[int, float]:
        started = time.monotonic()
        with urllib.request.urlopen(urllib.request.Request(url, data=b"x", method="POST"), timeout=150) as response:
            response.read()
            return response.status, time.monotonic() - started

    woken, cold_s = call()  # held by the gateway until the autoscaler's first pod is ready
    warm, warm_s = call()
    assert (woken, warm) == (200, 200)
    assert pods() == 1
    idle_since = time.monotonic()
    wait_until(lambda: pods() == 0, what="the idle function scaled to zero", timeout_s=90)
    to_zero_s = time.monotonic() - idle_since
    again, again_s = call()
    print(f"scale from zero: the first request answered after {cold_s:.1f}s (then {1000 * warm_s:.0f} ms); "
          f"zero pods {to_zero_s:.1f}s after the last request (delay 10 s, rate window 10 s); woken again "
          f"in {again_s:.1f}s")
    assert again == 200
    assert to_zero_s >= 10  # never before the scale-down delay
