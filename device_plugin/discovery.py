"""GPU discovery and health behind one small port, and the simulated backend.

A backend lists the node's GPUs and reports health changes. The NVML backend
(:mod:`device_plugin.nvml`) reads real GPUs; :class:`SimulatedGpus` serves ``--fake-gpus``
on machines without NVML (CI, laptops, the local demo) and lets tests flip health.
"""

from __future__ import annotations

import hashlib
import queue
from typing import Protocol

import attrs

from fastgshare.inventory import GpuDevice, GpuSpec


@attrs.frozen
class HealthEvent:
    """A GPU became unhealthy (or healthy again), and why."""

    uuid: str
    healthy: bool
    reason: str


class GpuBackend(Protocol):
    def devices(self) -> tuple[GpuDevice, ...]:
        """The node's GPUs as discovered at start (health as of now)."""
        ...

    def next_event(self, timeout_s: float) -> HealthEvent | None:
        """Block up to ``timeout_s`` for the next health event."""
        ...

    def close(self) -> None: ...


class SimulatedGpus:
    """GPUs described by a spec string; health changes only when :meth:`set_health` says so.

    UUIDs are stable per node name, so a restarted agent reports the same devices.
    """

    def __init__(self, spec: GpuSpec, node_name: str) -> None:
        digest = hashlib.sha256(node_name.encode()).hexdigest()[:8]
        self._devices = spec.devices(uuid_prefix=f"GPU-sim-{digest}")
        self._events: queue.Queue[HealthEvent] = queue.Queue()

    def devices(self) -> tuple[GpuDevice, ...]:
        return self._devices

    def next_event(self, timeout_s: float) -> HealthEvent | None:
        try:
            return self._events.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def set_health(self, uuid: str, healthy: bool, reason: str = "simulated") -> None:
        if uuid not in {gpu.uuid for gpu in self._devices}:
            raise KeyError(f"no simulated GPU {uuid}")
        self._events.put(HealthEvent(uuid, healthy, reason))

    def close(self) -> None:
        pass
