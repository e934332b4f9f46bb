"""The devices the plugin advertises: slots per healthy GPU, and who to tell on a change.

Each GPU is advertised as ``slots_per_gpu`` kubelet devices ``<uuid>::<slot>``, all with
the GPU's health. ListAndWatch streams subscribe here; every health change is fanned out to
every subscriber as a fresh full list (kubelet replaces its list on each message). Whether a GPU
has MPS changes too (:mod:`device_plugin.mps_watch`); that is no kubelet matter. Every change
moves :meth:`DeviceState.revision`, which the agent republishes the inventory on.
"""

from __future__ import annotations

import queue
import threading

import attrs

from fastgshare.inventory import GpuDevice, NodeInventory, slot_device_id

HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"


@attrs.frozen
class SlotDevice:
    id: str
    healthy: bool

    @property
    def health(self) -> str:
        return HEALTHY if self.healthy else UNHEALTHY


class DeviceState:
    """Current GPUs with their health; thread-safe; notifies ListAndWatch subscribers."""

    def __init__(self, node_name: str, gpus: tuple[GpuDevice, ...], slots_per_gpu: int) -> None:
        self.node_name = node_name
        self.slots_per_gpu = slots_per_gpu
        self._gpus = {gpu.uuid: gpu for gpu in gpus}
        self._lock = threading.Lock()
        self._revision = 0  # bumped on every change of a GPU
        self._subscribers: list[queue.Queue[list[SlotDevice]]] = []

    def inventory(self) -> NodeInventory:
        with self._lock:
            gpus = tuple(sorted(self._gpus.values(), key=lambda gpu: gpu.index))
        return NodeInventory(node_name=self.node_name, gpus=gpus, slots_per_gpu=self.slots_per_gpu)

    def gpu(self, uuid: str) -> GpuDevice | None:
        with self._lock:
            return self._gpus.get(uuid)

    def slots(self) -> list[SlotDevice]:
        with self._lock:
            return self._slots_locked()

    def set_health(self, uuid: str, healthy: bool) -> bool:
        """Change a GPU's health; True (and subscribers told) if it changed."""
        with self._lock:
            gpu = self._gpus.get(uuid)
            if gpu is None or gpu.healthy == healthy:
                return False
            self._gpus[uuid] = attrs.evolve(gpu, healthy=healthy)
            self._revision += 1
            update = self._slots_locked()
            subscribers = list(self._subscribers)
        for subscriber in subscribers:  # never send while holding the lock
            subscriber.put(update)
        return True

    def set_mps(self, uuid: str, enabled: bool) -> bool:
        """Change whether a GPU has MPS now; True if it changed."""
        with self._lock:
            gpu = self._gpus.get(uuid)
            if gpu is None or gpu.mps_enabled == enabled:
                return False
            self._gpus[uuid] = attrs.evolve(gpu, mps_enabled=enabled)
            self._revision += 1
            return True

    def revision(self) -> int:
        """A number that changes whenever any GPU does (health, MPS)."""
        with self._lock:
            return self._revision

    def subscribe(self) -> queue.Queue[list[SlotDevice]]:
        """A queue that receives the full list now and after every change."""
        updates: queue.Queue[list[SlotDevice]] = queue.Queue()
        with self._lock:
            self._subscribers.append(updates)
            updates.put(self._slots_locked())
        return updates

    def unsubscribe(self, updates: queue.Queue[list[SlotDevice]]) -> None:
        with self._lock:
            if updates in self._subscribers:
                self._subscribers.remove(updates)

    def _slots_locked(self) -> list[SlotDevice]:
        return [SlotDevice(slot_device_id(gpu.uuid, slot), gpu.healthy)
                for gpu in sorted(self._gpus.values(), key=lambda g: g.index)
                for slot in range(self.slots_per_gpu)]
