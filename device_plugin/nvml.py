"""The NVML backend: real GPUs and their XID health events, through pynvml.

The only module that imports ``pynvml`` (from the ``nvidia-ml-py`` package). Application
XIDs (a CUDA program's own faults) are ignored as NVIDIA's device plugin does; every other
XID marks the GPU unhealthy. Recovery is the agent's policy (``--health-recovery-seconds``).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pynvml

from device_plugin.discovery import HealthEvent
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


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
