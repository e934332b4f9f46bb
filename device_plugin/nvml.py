"""The NVML backend: real GPUs, their XID health events and what each process used, through pynvml.

The only module that imports ``pynvml`` (from the ``nvidia-ml-py`` package). Application
XIDs (a CUDA program's own faults) are ignored as NVIDIA's device plugin does; every other
XID marks the GPU unhealthy. Recovery is the agent's policy (``--health-recovery-seconds``).
:class:`NvmlProcessGpuTime` is the real GPU's side of the usage audit (:mod:`device_plugin.gpu_usage`).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pynvml

from device_plugin.discovery import HealthEvent
from device_plugin.gpu_usage import ProcessTime
from fastgshare.inventory import GpuDevice

log = logging.getLogger(__name__)

# XIDs caused by applications, not by the GPU: 13 graphics engine exception, 31 GPU memory
# page fault, 43 GPU stopped processing, 45 preemptive cleanup, 68 video processor exception,
# 109 context switch timeout. The same list the NVIDIA device plugin skips.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})

# SM counts by model name, for drivers whose NVML has no multiprocessor count.
_SM_COUNTS = {"V100": 80, "T4": 40, "A100": 108, "A30": 56, "A10": 72, "L4": 58, "L40": 142,
              "H100": 132, "H200": 132, "A40": 84}


class NvmlUnavailable(RuntimeError):
    """NVML could not be loaded or initialised on this machine."""


class NvmlGpus:
    """GPUs as NVML reports them. ``nvml`` is the pynvml module (tests pass a fake one)."""

    def __init__(self, mps_pipe_dir: str, nvml: ModuleType | None = None) -> None:
        self._nvml: Any = nvml or pynvml
        try:
            self._nvml.nvmlInit()
        except self._nvml.NVMLError as error:
            raise NvmlUnavailable(f"NVML failed to initialise: {error}") from None
        self._mps = (Path(mps_pipe_dir) / "control").exists()
        self._handles = [self._nvml.nvmlDeviceGetHandleByIndex(i) for i in range(self._nvml.nvmlDeviceGetCount())]
        self._devices = tuple(self._device(index, handle) for index, handle in enumerate(self._handles))
        self._events = self._register_events()

    def devices(self) -> tuple[GpuDevice, ...]:
        return self._devices

    def next_event(self, timeout_s: float) -> HealthEvent | None:
        if self._events is None:
            return None
        try:
            data = self._nvml.nvmlEventSetWait_v2(self._events, int(timeout_s * 1000))
        except self._nvml.NVMLError as error:
            if getattr(error, "value", None) == self._nvml.NVML_ERROR_TIMEOUT:
                return None
            log.warning("nvml event wait failed: %s", error)
            return None
        xid = int(data.eventData)
        uuid = _text(self._nvml.nvmlDeviceGetUUID(data.device))
        if xid in APPLICATION_XIDS:
            log.info("ignoring application xid=%d gpu=%s", xid, uuid)
            return None
        return HealthEvent(uuid, healthy=False, reason=f"critical XID {xid}")

    def process_seconds(self, since_us: int, elapsed_s: float) -> dict[str, dict[int, float]]:
        """GPU uuid -> pid -> GPU seconds each process used since ``since_us`` (CPU time, µs),
        from NVML's per-process utilisation: each sample's ``smUtil`` is the percent of one sample
        period in which the process had a kernel running; NVML returns a sample only for processes
        that ran, so the periods are counted on the device's own utilisation samples (every
        period, idle ones too)."""
        return {device.uuid: self._process_seconds(handle, since_us, elapsed_s)
                for device, handle in zip(self._devices, self._handles, strict=True)}

    def _process_seconds(self, handle: Any, since_us: int, elapsed_s: float) -> dict[int, float]:
        try:
            samples = self._nvml.nvmlDeviceGetProcessUtilization(handle, since_us)
        except self._nvml.NVMLError as error:
            if getattr(error, "value", None) not in (self._nvml.NVML_ERROR_NOT_FOUND, self._nvml.NVML_SUCCESS):
                log.warning("nvml per-process utilisation unavailable: %s", error)
            return {}  # NOT_FOUND (or an empty answer): no process ran since then
        periods = self._sample_periods(handle, since_us) or len({int(s.timeStamp) for s in samples})
        seconds: dict[int, float] = {}
        for sample in samples:
            pid = int(sample.pid)
            seconds[pid] = seconds.get(pid, 0.0) + int(sample.smUtil) / 100 / max(periods, 1) * elapsed_s
        return seconds

    def _sample_periods(self, handle: Any, since_us: int) -> int:
        try:
            _kind, samples = self._nvml.nvmlDeviceGetSamples(handle, self._nvml.NVML_GPU_UTILIZATION_SAMPLES,
                                                             since_us)
        except self._nvml.NVMLError:
            return 0
        return len(samples)

    def close(self) -> None:
        if self._events is not None:
            self._nvml.nvmlEventSetFree(self._events)
        self._nvml.nvmlShutdown()

    def _device(self, index: int, handle: Any) -> GpuDevice:
        name = _text(self._nvml.nvmlDeviceGetName(handle))
        return GpuDevice(
            uuid=_text(self._nvml.nvmlDeviceGetUUID(handle)),
            index=index,
            model=name,
            memory_bytes=int(self._nvml.nvmlDeviceGetMemoryInfo(handle).total),
            sm_count=self._sm_count(handle, name),
            mps_enabled=self._mps,
        )

    def _sm_count(self, handle: Any, name: str) -> int:
        try:
            return int(self._nvml.nvmlDeviceGetAttributes_v2(handle).multiprocessorCount)
        except (self._nvml.NVMLError, AttributeError):
            pass
        words = set(re.split(r"[\s-]+", name))  # "Tesla V100-PCIE-16GB" -> {..., "V100", ...}
        for model, count in _SM_COUNTS.items():
            if model in words:
                return count
        raise NvmlUnavailable(f"cannot tell the SM count of {name!r}: NVML has no multiprocessor count "
                              "and the model is not in the fallback table")

    def _register_events(self) -> Any:
        try:
            events = self._nvml.nvmlEventSetCreate()
            for handle in self._handles:
                self._nvml.nvmlDeviceRegisterEvents(handle, self._nvml.nvmlEventTypeXidCriticalError, events)
        except self._nvml.NVMLError as error:
            log.warning("nvml health events unavailable (%s): GPUs stay healthy", error)
            return None
        return events


class NvmlProcessGpuTime:
    """The :class:`~device_plugin.gpu_usage.ProcessGpuTime` port on a real GPU: NVML's
    per-process utilisation since the previous reading (pids are the host's)."""

    def __init__(self, gpus: NvmlGpus, clock: Callable[[], float] = time.time) -> None:
        self._gpus = gpus
        self._clock = clock  # NVML's sample timestamps are CPU wall-clock microseconds
        self._since_us: int | None = None

    def read(self) -> ProcessTime | None:
        now_us = int(self._clock() * 1e6)
        since_us, self._since_us = self._since_us, now_us
        if since_us is None:
            return None
        elapsed_s = (now_us - since_us) / 1e6
        return ProcessTime(elapsed_s=elapsed_s, seconds=self._gpus.process_seconds(since_us, elapsed_s))


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
