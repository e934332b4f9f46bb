"""The node agent's ``/metrics`` (Prometheus text format) and ``/healthz``: per pod, the share it
was promised next to the share it got; per GPU, how busy it was, its health and memory.

Metric names and labels are a contract (docs/observability.md). Every value is built at scrape
time from three sources: the pods bound to this node with an assignment (what was promised), the
arbiter's usage snapshot (what was delivered: GPU time the hooks reported over the last 10 s,
token waits, throttling, memory), and the device state (health); plus the usage audit's latest
comparison of the charges with the GPU's own account (:mod:`device_plugin.gpu_usage`). Whether a GPU
has MPS is the device state's, as of now (:mod:`device_plugin.mps_watch`). A pod's
series go when the pod leaves the cache (promised) or its use has left the window (delivered).
Per GPU and model (``ModelRef.key``): the bytes the model store holds and how many live pods on the
GPU declare the model (:mod:`device_plugin.models.store`; 0 pods while in its grace period).

The only module of the agent that imports ``prometheus_client``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from device_plugin.allocation import NodePod
from device_plugin.arbiter.server import ArbiterUsage
from device_plugin.arbiter.shares import share_of
from fastgshare.inventory import NodeInventory
from fastgshare.model import HeldModel
from fastgshare.usage import WAIT_BUCKETS_S
from fastgshare_kube.health import HealthServer
from fastgshare_kube.metrics_access import MetricsAccess

log = logging.getLogger(__name__)

POD_LABELS = ("namespace", "pod", "gpu")
_FINISHED = ("Succeeded", "Failed")


class PodSource(Protocol):
    def snapshot(self) -> tuple[int, list[NodePod]]: ...


class ModelCounts(Protocol):
    """The model store's view (:class:`device_plugin.models.store.ModelStore`)."""

    def held_models(self) -> Mapping[str, tuple[HeldModel, ...]]: ...

    def model_pods(self) -> Mapping[tuple[str, str], int]: ...


class NodeMetrics:
    """A Prometheus collector over the agent's pods, arbiter and devices."""

    def __init__(self, pods: PodSource, usage: Callable[[], ArbiterUsage],
                 inventory: Callable[[], NodeInventory],
                 unaccounted: Callable[[], Mapping[tuple[str, str, str], float]] | None = None,
                 models: ModelCounts | None = None) -> None:
        self._pods = pods
        self._models = models
        self._usage = usage
        self._inventory = inventory
        self._unaccounted = unaccounted  # (namespace, pod, GPU) -> share: the usage audit's latest

    def describe(self) -> list[Metric]:
        return []  # built at scrape time only

    def collect(self) -> Iterator[Metric]:
        promised = self._promised()
        try:
            usage: ArbiterUsage | None = self._usage()
        except Exception as error:
            log.warning("metrics: the arbiter did not answer: %s", error)
            usage = None
        yield from self._pod_families(promised, usage)
        yield from self._unaccounted_family()
        yield from self._gpu_families(usage)
        yield from self._model_families()

    def _model_families(self) -> Iterator[Metric]:
        if self._models is None:
            return
        memory = GaugeMetricFamily("fastgshare_gpu_model_memory_bytes",
                                   "GPU memory the node's model store holds for the model on the GPU (once, however "
                                   "many pods map it; also during the grace period after its last pod left)",
                                   labels=["gpu", "model"])
        pods = GaugeMetricFamily("fastgshare_gpu_model_pods",
                                 "Live pods on the GPU that declare the model (fastgshare/model)",
                                 labels=["gpu", "model"])
        held: dict[tuple[str, str], int] = {}
        for gpu, models in self._models.held_models().items():
            for model in models:  # two declarations with one key (a changed spec.model) add up
                held[(gpu, model.key)] = held.get((gpu, model.key), 0) + model.bytes
        for (gpu, key), size in sorted(held.items()):
            memory.add_metric([gpu, key], size)
        for (gpu, key), count in sorted(self._models.model_pods().items()):
            pods.add_metric([gpu, key], count)
        yield from (memory, pods)

    def _unaccounted_family(self) -> Iterator[Metric]:
        if self._unaccounted is None:
            return
        family = GaugeMetricFamily(
            "fastgshare_pod_gpu_time_unaccounted_share",
            "Share of GPU time (0..1) the GPU reports the pod's processes used minus the share the arbiter "
            "charged it, over the last audit interval (~10 s); positive: used without being charged",
            labels=POD_LABELS)
        for (namespace, name, gpu), share in sorted(self._unaccounted().items()):
            family.add_metric([namespace, name, gpu], share)
        yield family

    def _promised(self) -> dict[tuple[str, str], tuple[str, str, NodePod]]:
        """(gpu, pod key) -> (namespace, name, record) of every running pod with an assignment."""
        found = {}
        for pod in self._pods.snapshot()[1]:
            share = share_of(pod)
            if share is not None and pod.phase not in _FINISHED and not pod.deleting:
                found[(share.gpu_uuid, pod.key)] = (pod.namespace, pod.name, pod)
        return found

    def _pod_families(self, promised: dict[tuple[str, str], tuple[str, str, NodePod]],
                      usage: ArbiterUsage | None) -> Iterator[Metric]:
        request = GaugeMetricFamily("fastgshare_pod_gpu_time_request",
                                    "Guaranteed share of GPU time (0..1) of the pod's assignment", labels=POD_LABELS)
        limit = GaugeMetricFamily("fastgshare_pod_gpu_time_limit",
                                  "Maximum share of GPU time (0..1) of the pod's assignment", labels=POD_LABELS)
        sm = GaugeMetricFamily("fastgshare_pod_gpu_sm_percent", "Percent of the GPU's SMs the pod may use",
                               labels=POD_LABELS)
        memory_limit = GaugeMetricFamily("fastgshare_pod_gpu_memory_limit_bytes",
                                         "GPU memory the pod may allocate", labels=POD_LABELS)
        for (gpu, _key), (namespace, name, record) in sorted(promised.items()):
            share = share_of(record)
            assert share is not None
            labels = [namespace, name, gpu]
            request.add_metric(labels, share.time.request_permille / 1000)
            limit.add_metric(labels, share.time.limit_permille / 1000)
            sm.add_metric(labels, share.time.sm_percent)
            memory_limit.add_metric(labels, share.memory_bytes)
        yield from (request, limit, sm, memory_limit)

        achieved = GaugeMetricFamily(
            "fastgshare_pod_gpu_time_share",
            "Share of GPU time (0..1) charged to the pod over the last 10 s (each token at least the time held)",
            labels=POD_LABELS)
        memory_used = GaugeMetricFamily("fastgshare_pod_gpu_memory_used_bytes",
                                        "GPU memory the pod's processes hold through the hook", labels=POD_LABELS)
        waits = HistogramMetricFamily("fastgshare_pod_gpu_token_wait_seconds",
                                      "Time from asking for a GPU time token to receiving it", labels=POD_LABELS)
        throttled = CounterMetricFamily(
            "fastgshare_pod_gpu_throttled_seconds",
            "Time the pod waited for a token because it had used its limit (not because of other pods)",
            labels=POD_LABELS)
        if usage is not None:
            for pod in usage.usage.pods:
                namespace, _, name = pod.pod.partition("/")
                labels = [namespace, name, pod.gpu]
                achieved.add_metric(labels, pod.share)
                memory_used.add_metric(labels, usage.memory_bytes.get((pod.gpu, pod.pod), 0))
                buckets = [(str(bound), count) for bound, count in zip(WAIT_BUCKETS_S, pod.wait_bucket_counts,
                                                                       strict=False)]
                buckets.append(("+Inf", pod.wait_count))
                waits.add_metric(labels, buckets, pod.wait_sum_seconds)
                throttled.add_metric(labels, pod.throttled_seconds_total)
        yield from (achieved, memory_used, waits, throttled)

    def _gpu_families(self, usage: ArbiterUsage | None) -> Iterator[Metric]:
        inventory = self._inventory()
        healthy = GaugeMetricFamily("fastgshare_gpu_healthy", "1 while the GPU is healthy (no critical XID)",
                                    labels=["gpu"])
        busy = GaugeMetricFamily("fastgshare_gpu_time_busy_share",
                                 "Share of the last 10 s in which some pod held the GPU", labels=["gpu"])
        allocated = GaugeMetricFamily("fastgshare_gpu_memory_allocated_bytes",
                                      "GPU memory the pods' processes hold through the hook", labels=["gpu"])
        reserve = GaugeMetricFamily("fastgshare_gpu_context_reserve_bytes",
                                    "GPU memory each pod on the GPU is charged for its CUDA context, next to its "
                                    "gpu_mem (the agent's --context-reserve)", labels=["gpu"])
        mps = GaugeMetricFamily("fastgshare_gpu_mps_active",
                                "1 while the MPS control daemon serves the GPU (SM partitions applied), 0 without "
                                "(pods take turns on the whole GPU)", labels=["gpu"])
        by_gpu = {g.gpu: g.busy_share for g in usage.usage.gpus} if usage else {}
        for gpu in inventory.gpus:
            healthy.add_metric([gpu.uuid], 1 if gpu.healthy else 0)
            busy.add_metric([gpu.uuid], by_gpu.get(gpu.uuid, 0.0))
            held = sum(b for (g, _pod), b in usage.memory_bytes.items() if g == gpu.uuid) if usage else 0
            allocated.add_metric([gpu.uuid], held)
            reserve.add_metric([gpu.uuid], gpu.context_reserve_bytes)
            mps.add_metric([gpu.uuid], 1 if gpu.mps_enabled else 0)
        yield from (healthy, busy, allocated, reserve, mps)


def metrics_server(host: str, port: int, collector: NodeMetrics, healthy: Callable[[], bool], *,
                   access: MetricsAccess | None = None) -> HealthServer:
    """The node agent's ``/metrics`` (``collector``), ``/healthz`` and ``/readyz`` (200 while
    ``healthy()`` says so) on the services' one health server (:class:`~fastgshare_kube.health.HealthServer`,
    a :class:`~fastgshare_kube.guarded_http.GuardedHttpServer`: any pod on the node's network can
    connect, so idle and slow clients are closed on deadlines, connections are capped and a few
    threads serve every request). With ``access``, ``/metrics`` is served only to whom the API server
    allows it (:mod:`fastgshare_kube.metrics_access`: the per-pod names and shares are what RBAC
    hides from tenants); the probes stay open. Not started."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return HealthServer(host, port, healthy, lambda: (generate_latest(registry), CONTENT_TYPE_LATEST),
                        access=access, name="metrics")
