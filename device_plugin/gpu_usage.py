"""The audit of the arbiter's charges against what the GPU itself says each process used.

The arbiter charges each pod for the GPU time tokens gave it (at least the time each token was
held); a process that bypasses the hook (or a hook that lies) uses the GPU without a token, so
the charge misses it. The GPU's own per-process accounting does not depend on the hook: NVML's
per-process utilisation on a real GPU (:class:`device_plugin.nvml.NvmlProcessGpuTime`), the
simulated GPU's per-process busy time where GPUs are simulated
(:class:`device_plugin.simulated_usage.SimulatedProcessGpuTime`). This module owns the port both
adapters implement (:class:`ProcessGpuTime`), the pure comparison (:func:`pod_seconds`,
:func:`unaccounted`) and the loop (:class:`UsageAudit`) that, every :data:`AUDIT_PERIOD_S`, reads
both sides over the same interval, keeps the difference for ``/metrics``
(``fastgshare_pod_gpu_time_unaccounted_share``) and reports a pod above the threshold with a
Warning Event ``GPUTimeUnaccounted`` (at most one per pod per :data:`EVENT_INTERVAL_S`).

Processes are mapped to pods as the arbiter maps its peers: ``/proc/<pid>/cgroup`` names the pod's
uid (:mod:`device_plugin.arbiter.identity`); pids are the host's (the agent runs with hostPID).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Protocol

import attrs

from device_plugin.allocation import NodePod
from device_plugin.arbiter.server import ArbiterUsage

log = logging.getLogger(__name__)

AUDIT_PERIOD_S = 10.0  # the arbiter's meter window: both sides are compared over ~10 s intervals
EVENT_INTERVAL_S = 300.0  # at most one GPUTimeUnaccounted Event per pod in this long
DEFAULT_THRESHOLD = 0.05
REASON_GPU_TIME_UNACCOUNTED = "GPUTimeUnaccounted"

GpuPod = tuple[str, str]  # (GPU uuid, pod key "namespace/name")


@attrs.frozen
class ProcessTime:
    """GPU seconds each process used on each GPU over ``elapsed_s``, as the GPU reports it."""

    elapsed_s: float
    seconds: Mapping[str, Mapping[int, float]]  # GPU uuid -> host pid -> GPU seconds


class ProcessGpuTime(Protocol):
    """What the GPU says each process used: the port of the GPU's own accounting."""

    def read(self) -> ProcessTime | None:
        """Use since the previous call; None on the first call (nothing to measure from yet)."""
        ...


class PodSource(Protocol):
    def snapshot(self) -> tuple[int, list[NodePod]]: ...


def pod_seconds(reported: ProcessTime, pod_of_pid: Callable[[int], str | None],
                pods_by_uid: Mapping[str, NodePod]) -> dict[GpuPod, float]:
    """(GPU, pod key) -> GPU seconds the pod's processes used, by the GPU's account. Processes of
    no pod on this node (the host's own, or a pod the cache does not know yet) are left out."""
    found: dict[GpuPod, float] = {}
    for gpu, by_pid in reported.seconds.items():
        for pid, seconds in by_pid.items():
            uid = pod_of_pid(pid)
            pod = pods_by_uid.get(uid) if uid is not None else None
            if pod is None:
                log.debug("gpu usage: pid %d on %s is in no known pod (uid %s)", pid, gpu, uid)
                continue
            key = (gpu, pod.key)
            found[key] = found.get(key, 0.0) + seconds
    return found


def unaccounted(reported_s: Mapping[GpuPod, float], charged_s: Mapping[GpuPod, float],
                elapsed_s: float) -> dict[GpuPod, float]:
    """(GPU, pod) -> (GPU-reported seconds - charged seconds) / ``elapsed_s``, for every pod on
    either side: positive when the pod used more than it was charged (e.g. it bypassed the hook)."""
    if elapsed_s <= 0:
        return {}
    return {key: (reported_s.get(key, 0.0) - charged_s.get(key, 0.0)) / elapsed_s
            for key in sorted(set(reported_s) | set(charged_s))}


class ChargeCounter:
    """The arbiter's charges over an interval: the difference of its cumulative per-pod counters
    between two snapshots (a counter that went back, after the arbiter restarted, counts from 0)."""

    def __init__(self) -> None:
        self._last: dict[GpuPod, float] = {}

    def since_last(self, usage: ArbiterUsage) -> dict[GpuPod, float]:
        now = {(pod.gpu, pod.pod): pod.used_seconds_total for pod in usage.usage.pods}
        charged = {}
        for key, total in now.items():
            before = self._last.get(key, 0.0)
            charged[key] = total - before if total >= before else total
        self._last = now
        return charged


class UsageAudit:
    """Every :data:`AUDIT_PERIOD_S`: the GPU's account and the arbiter's charges over the same
    interval, their difference per pod (for the metrics), and an Event per pod above ``threshold``."""

    def __init__(self, gpu: ProcessGpuTime, arbiter_usage: Callable[[], ArbiterUsage], pods: PodSource,
                 warn: Callable[[NodePod, str, str], None], pod_of_pid: Callable[[int], str | None], *,
                 threshold: float = DEFAULT_THRESHOLD, clock: Callable[[], float] = time.monotonic) -> None:
        self._gpu = gpu
        self._arbiter_usage = arbiter_usage
        self._pods = pods
        self._warn = warn  # a Warning Event on the pod: (pod, reason, message)
        self._pod_of_pid = pod_of_pid
        self._threshold = threshold
        self._clock = clock
        self._charges = ChargeCounter()
        self._latest: dict[tuple[str, str, str], float] = {}
        self._warned_at: dict[str, float] = {}  # pod uid -> when its last Event went out
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def latest(self) -> dict[tuple[str, str, str], float]:
        """(namespace, pod, GPU) -> unaccounted share over the last interval (for ``/metrics``)."""
        with self._lock:
            return dict(self._latest)

    def tick(self) -> None:
        """Read both sides once, keep the difference and report the pods above the threshold."""
        reported = self._gpu.read()
        charged = self._charges.since_last(self._arbiter_usage())
        if reported is None:
            return  # the first reading: both sides now have their baseline
        pods = {pod.uid: pod for pod in self._pods.snapshot()[1]}
        for uid in [uid for uid in self._warned_at if uid not in pods]:
            del self._warned_at[uid]  # the pod is gone: keep the map bounded
        by_key = {pod.key: pod for pod in pods.values()}
        differences = unaccounted(pod_seconds(reported, self._pod_of_pid, pods), charged, reported.elapsed_s)
        latest = {}
        for (gpu, key), share in differences.items():
            namespace, _, name = key.partition("/")
            latest[(namespace, name, gpu)] = share
            if share > self._threshold and (pod := by_key.get(key)) is not None:
                self._report(pod, gpu, share, reported.elapsed_s)
        with self._lock:
            self._latest = latest

    def _report(self, pod: NodePod, gpu: str, share: float, elapsed_s: float) -> None:
        now = self._clock()
        last = self._warned_at.get(pod.uid)
        if last is not None and now - last < EVENT_INTERVAL_S:
            return
        self._warned_at[pod.uid] = now
        message = (f"GPU {gpu} reports {share:.2f} of its time over the last {elapsed_s:.0f} s used by this pod's "
                   f"processes beyond what the arbiter charged (threshold {self._threshold:.2f}): a process may "
                   "be using the GPU around the fastgshare hook")
        log.warning("%s: %s", pod.key, message)
        self._warn(pod, REASON_GPU_TIME_UNACCOUNTED, message)

    def start(self, period_s: float = AUDIT_PERIOD_S) -> None:
        self._thread = threading.Thread(target=self._run, args=(period_s,), name="gpu-usage-audit", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def _run(self, period_s: float) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # one failed reading must not end the audit
                log.exception("gpu usage audit failed; trying again in %.0f s", period_s)
            self._stop.wait(period_s)

