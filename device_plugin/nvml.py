"""The NVML backend: real GPUs, their XID health events and what each process used, through pynvml.

The only module that imports ``pynvml`` (from the ``nvidia-ml-py`` package). Application
XIDs (a CUDA program's own faults) are ignored as NVIDIA's device plugin does; every other
XID marks the GPU unhealthy. Recovery is the agent's policy (``--health-recovery-seconds``).
:class:`NvmlProcessGpuTime` is the real GPU's side of the usage audit (:mod:`device_plugin.gpu_usage`).

Each GPU's SM count comes from the CUDA driver (:mod:`device_plugin.cuda_attributes`, matched to
NVML's device by UUID, else by PCI bus id), else from NVML where it answers, else from the model
table (:func:`table_sm_count`, the longest family name in the GPU's name); a model nothing knows
gets :data:`UNKNOWN_SM_COUNT` and one log line, and the agent runs on. A GPU in MIG mode is left
out (one log line): fastgshare shares whole GPUs.
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

from device_plugin.cuda_attributes import CudaUnavailable, DriverDevice, driver_devices, pci_key
from device_plugin.discovery import HealthEvent
from device_plugin.gpu_usage import ProcessTime
from fastgshare.inventory import GpuDevice

log = logging.getLogger(__name__)

# XIDs caused by applications, not by the GPU: 13 graphics engine exception, 31 GPU memory
# page fault, 43 GPU stopped processing, 45 preemptive cleanup, 68 video processor exception,
# 109 context switch timeout. The same list the NVIDIA device plugin skips.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})

# SM counts by model family, for GPUs the driver does not answer for: the words of a family's
# name, all in the GPU's name (NVML's, split at spaces and "-"); the family with the most words
# wins ("H100 PCIe" over "H100"). Figures: each product's full SM count, from NVIDIA's data sheets.
_SM_COUNTS: dict[tuple[str, ...], int] = {
    ("V100",): 80, ("T4",): 40, ("A100",): 108, ("A30",): 56, ("A10",): 72, ("A40",): 84, ("L4",): 58,
    ("L40",): 142, ("L40S",): 142, ("RTX", "A6000"): 84, ("RTX", "6000", "Ada"): 142, ("RTX", "4090"): 128,
    ("H100",): 132, ("H100", "PCIe"): 114, ("H100", "NVL"): 132, ("H200",): 132, ("GH200",): 132,
}
# A GPU no source can tell: 1, a figure nobody can take for a measured one. Nothing is packed or
# partitioned by it (SM partitions are percentages of the whole GPU, applied by MPS); it is shown
# in the inventory, next to the log line that says why.
UNKNOWN_SM_COUNT = 1
_MIG_ENABLED = 1  # NVML_DEVICE_MIG_ENABLE


def table_sm_count(name: str) -> int | None:
    """The model table's SM count for an NVML device name, or None if no family matches."""
    words = {word.lower() for word in re.split(r"[\s-]+", name) if word}
    matches = [(len(family), count) for family, count in _SM_COUNTS.items()
               if all(word.lower() in words for word in family)]
    return max(matches)[1] if matches else None


class NvmlUnavailable(RuntimeError):
    """NVML could not be loaded or initialised on this machine."""


class NvmlGpus:
    """GPUs as NVML reports them, less those in MIG mode. ``nvml`` is the pynvml module and
    ``driver`` what the CUDA driver reports (tests pass fakes of both)."""

    def __init__(self, mps_pipe_dir: str, nvml: ModuleType | None = None,
                 driver: Callable[[], tuple[DriverDevice, ...]] = driver_devices) -> None:
        self._nvml: Any = nvml or pynvml
        try:
            self._nvml.nvmlInit()
        except self._nvml.NVMLError as error:
            raise NvmlUnavailable(f"NVML failed to initialise: {error}") from None
        self._mps = (Path(mps_pipe_dir) / "control").exists()
        found = [(i, self._nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(self._nvml.nvmlDeviceGetCount())]
        shared = [(index, handle) for index, handle in found if not self._left_out_for_mig(index, handle)]
        self._driver = self._ask_driver(driver) if shared else {}
        self._handles = [handle for _, handle in shared]
        self._devices = tuple(self._device(index, handle) for index, handle in shared)
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
        uuid = _text(self._nvml.nvmlDeviceGetUUID(handle))
        return GpuDevice(
            uuid=uuid,
            index=index,
            model=name,
            memory_bytes=int(self._nvml.nvmlDeviceGetMemoryInfo(handle).total),
            sm_count=self._sm_count(handle, name, uuid),
            mps_enabled=self._mps,
        )

    def _left_out_for_mig(self, index: int, handle: Any) -> bool:
        """True (with one log line) for a GPU in MIG mode; a GPU without MIG says NOT_SUPPORTED."""
        try:
            current, _pending = self._nvml.nvmlDeviceGetMigMode(handle)
        except (self._nvml.NVMLError, AttributeError):
            return False
        if int(current) != _MIG_ENABLED:
            return False
        log.warning("GPU %d %s (%s) is in MIG mode: left out of sharing (fastgshare shares whole GPUs; "
                    "`nvidia-smi -i %d -mig 0` turns MIG off)", index, _text(self._nvml.nvmlDeviceGetUUID(handle)),
                    _text(self._nvml.nvmlDeviceGetName(handle)), index)
        return True

    @staticmethod
    def _ask_driver(driver: Callable[[], tuple[DriverDevice, ...]]) -> dict[str, int]:
        """The driver's SM counts by UUID and by PCI bus id ({} with one log line if it cannot say)."""
        try:
            devices = driver()
        except CudaUnavailable as error:
            log.warning("SM counts: the CUDA driver cannot be asked (%s); using NVML or the model table", error)
            return {}
        return {key: device.sm_count for device in devices for key in (device.uuid, device.pci_bus_id)}

    def _sm_count(self, handle: Any, name: str, uuid: str) -> int:
        count = self._driver.get(uuid) or self._driver.get(self._pci_key(handle))
        if count:
            return count
        try:
            return int(self._nvml.nvmlDeviceGetAttributes_v2(handle).multiprocessorCount)
        except (self._nvml.NVMLError, AttributeError):
            pass
        count = table_sm_count(name)
        if count is not None:
            log.info("GPU %s (%s): %d SMs from the model table (neither the CUDA driver nor NVML told)",
                     uuid, name, count)
            return count
        log.warning("GPU %s (%s): cannot tell the SM count (neither the CUDA driver nor NVML told, and no model "
                    "family in the table matches); publishing %d SM, SM partitions are unaffected", uuid, name,
                    UNKNOWN_SM_COUNT)
        return UNKNOWN_SM_COUNT

    def _pci_key(self, handle: Any) -> str:
        try:
            return pci_key(_text(self._nvml.nvmlDeviceGetPciInfo(handle).busId))
        except (self._nvml.NVMLError, AttributeError):
            return ""

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
