"""Following the MPS control daemon for the agent's whole life: the thin I/O around :mod:`device_plugin.mps`.

Every ``interval_s`` it looks for the daemon's ``control`` pipe in ``--mps-pipe-dir``
(``nvidia-cuda-mps-control -d`` makes it and removes it when it quits). When a GPU's MPS starts or
stops: the device state changes (the health loop republishes the inventory and ``/metrics`` shows
``fastgshare_gpu_mps_active``; Allocate gives new containers the MPS variables or not), the
arbiter's scheduler for the GPU follows, one Normal Event on the Node says so, and each running pod
whose SM partition is no longer applied gets one Warning (:class:`~device_plugin.mps.UnappliedPartitions`).
Allocate tells :meth:`MpsFollower.allocated` of each pod it served, for the same Warning.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

from device_plugin.allocation import NodePod
from device_plugin.devices import DeviceState
from device_plugin.mps import (
    REASON_PARTITION_NOT_APPLIED,
    MpsChange,
    UnappliedPartitions,
    mps_change,
    node_events,
    with_mps,
)
from fastgshare import keys

log = logging.getLogger(__name__)

MPS_POLL_S = 1.0  # how often the pipe directory is looked at


class ArbiterMps(Protocol):
    def set_mps(self, gpu_uuid: str, enabled: bool) -> None: ...


class MpsEvents(Protocol):
    def node_event(self, node_name: str, reason: str, message: str) -> None: ...

    def warn(self, pod: NodePod, reason: str, message: str) -> None: ...


class PodSource(Protocol):
    def snapshot(self) -> tuple[int, list[NodePod]]: ...


def control_pipe(pipe_dir: Path) -> Path:
    return pipe_dir / keys.MPS_CONTROL_PIPE


def daemon_running(pipe_dir: Path) -> bool:
    """Whether the MPS control daemon's ``control`` pipe is in ``pipe_dir``."""
    return control_pipe(pipe_dir).exists()


class MpsFollower:
    """Looks for the MPS control daemon and carries out what a change means (see the module)."""

    def __init__(self, pipe_dir: Path, *, allowed: Mapping[str, bool], devices: DeviceState, arbiter: ArbiterMps,
                 events: MpsEvents, pods: PodSource, node_name: str, stopping: threading.Event,
                 interval_s: float = MPS_POLL_S, running: Callable[[Path], bool] = daemon_running) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s {interval_s}: must be > 0 seconds")
        self._pipe_dir = pipe_dir
        self._allowed = dict(allowed)
        self._devices = devices
        self._arbiter = arbiter
        self._events = events
        self._pods = pods
        self._node_name = node_name
        self._stopping = stopping
        self._interval_s = interval_s
        self._running = running
        self._partitions = UnappliedPartitions()
        self._lock = threading.Lock()  # one change at a time; Allocate's checks wait for it
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="mps", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def poll(self) -> MpsChange:
        """Look once; carry out a change (and return it)."""
        running = self._running(self._pipe_dir)
        with self._lock:
            gpus = self._devices.inventory().gpus
            before = {gpu.uuid: gpu.mps_enabled for gpu in gpus}
            after = {gpu.uuid: gpu.mps_enabled for gpu in with_mps(gpus, self._allowed, running)}
            change = mps_change(before, after)
            for uuid in (*change.started, *change.stopped):
                self._devices.set_mps(uuid, after[uuid])
                self._arbiter.set_mps(uuid, after[uuid])
                log.warning("gpu=%s mps=%s (%s %s)", uuid, after[uuid], control_pipe(self._pipe_dir),
                            "appeared" if after[uuid] else "is gone")
            warnings = []
            if change:
                _, pods = self._pods.snapshot()
                warnings = self._partitions.check([pod for pod in pods if pod.allocated], after,
                                                  known=[pod.uid for pod in pods])
        for reason, message in node_events(change, str(control_pipe(self._pipe_dir))):
            self._events.node_event(self._node_name, reason, message)
        self._warn(warnings)
        return change

    def allocated(self, pod: NodePod) -> None:
        """Allocate served ``pod``: warn if its GPU has no MPS to apply its SM partition."""
        with self._lock:
            mps = {gpu.uuid: gpu.mps_enabled for gpu in self._devices.inventory().gpus}
            warnings = self._partitions.check([pod], mps)
        self._warn(warnings)

    def _warn(self, warnings: list[tuple[NodePod, str]]) -> None:
        for pod, message in warnings:
            log.warning("pod=%s %s", pod.key, message)
            self._events.warn(pod, REASON_PARTITION_NOT_APPLIED, message)

    def _loop(self) -> None:
        while not self._stopping.wait(self._interval_s):
            try:
                self.poll()
            except Exception:  # a failed look must not end the following
                log.exception("looking for the MPS control daemon in %s failed", self._pipe_dir)
