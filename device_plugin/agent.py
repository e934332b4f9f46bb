"""The node agent's run loop: serve, register, re-register after kubelet restarts, track health.

State that must survive a kubelet restart (device health, pods being allocated) lives in
objects created once and handed to each new server; only the gRPC server and its socket are
recreated. Two threads: the plugin loop (serve, register, watch kubelet) and the health loop
(GPU events, recovery, inventory publishing: whenever the devices change, health or MPS, or the
models the node's model store holds on a GPU, :mod:`device_plugin.models.store`). The annotation
is rewritten only when its text changes (:meth:`device_plugin.kube.KubeWriter.publish_inventory`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import attrs

from device_plugin.devices import DeviceState
from device_plugin.discovery import GpuBackend
from device_plugin.registration import KubeletWatch, RegistrationError, register
from device_plugin.servicer import DevicePluginServicer, PluginServer
from fastgshare import keys
from fastgshare.codec import encode_node_inventory
from fastgshare.inventory import NodeInventory
from fastgshare.model import HeldModel

log = logging.getLogger(__name__)

MAX_RETRY_S = 30.0


class InventoryPublisher(Protocol):
    def publish_inventory(self, node_name: str, payload: str) -> bool: ...


class HeldModels(Protocol):
    """What the node's model store holds per GPU (:class:`device_plugin.models.store.ModelStore`)."""

    def revision(self) -> int: ...

    def held_models(self) -> Mapping[str, tuple[HeldModel, ...]]: ...


def with_held_models(inventory: NodeInventory, held: Mapping[str, tuple[HeldModel, ...]]) -> NodeInventory:
    """``inventory`` with each GPU's ``held_models`` as the store says (sorted: equal holdings, equal text)."""
    gpus = []
    for gpu in inventory.gpus:
        # Any: mypy's attrs plugin cannot type the field's tuple converter (fastgshare.codec meets it too)
        models: Any = tuple(sorted(held.get(gpu.uuid, ()), key=lambda model: model.identity))
        gpus.append(attrs.evolve(gpu, held_models=models))
    return attrs.evolve(inventory, gpus=tuple(gpus))


class NodeAgent:
    def __init__(self, *, devices: DeviceState, backend: GpuBackend, make_servicer: Callable[[], DevicePluginServicer],
                 publisher: InventoryPublisher, plugin_dir: Path, stopping: threading.Event,
                 health_recovery_s: float = 0.0, retry_s: float = 1.0, models: HeldModels | None = None) -> None:
        self.devices = devices
        self._models = models
        self._backend = backend
        self._make_servicer = make_servicer
        self._publisher = publisher
        self._plugin_dir = plugin_dir
        self._stopping = stopping
        self._recovery_s = health_recovery_s
        self._retry_s = retry_s
        self.socket_path = plugin_dir / keys.DEVICE_PLUGIN_SOCKET
        self.registrations = 0  # how many times kubelet accepted us (for tests and logs)
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for target, name in ((self._plugin_loop, "plugin"), (self._health_loop, "health")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout=10)
        self._backend.close()

    # --- kubelet ---------------------------------------------------------------------
    def _plugin_loop(self) -> None:
        while not self._stopping.is_set():
            server = PluginServer(self._make_servicer(), self.socket_path)
            server.start()
            log.info("serving device plugin socket=%s resource=%s", self.socket_path, keys.VGPU_RESOURCE)
            try:
                if not self._register_until_accepted():
                    return
                reason = KubeletWatch(self._plugin_dir, self.socket_path).wait_for_restart(self._stopping)
                if reason is not None:
                    log.info("kubelet restarted (%s): serving and registering again", reason)
            finally:
                server.stop()

    def _register_until_accepted(self) -> bool:
        delay = self._retry_s
        while not self._stopping.is_set():
            try:
                register(self._plugin_dir, keys.DEVICE_PLUGIN_SOCKET)
            except RegistrationError as error:
                log.warning("%s; retrying in %gs", error, delay)
                self._stopping.wait(delay)
                delay = min(delay * 2, MAX_RETRY_S)  # kubelet may take a while: back off
                continue
            self.registrations += 1
            log.info("registered with kubelet resource=%s endpoint=%s", keys.VGPU_RESOURCE, keys.DEVICE_PLUGIN_SOCKET)
            return True
        return False

    # --- health and inventory --------------------------------------------------------
    def _health_loop(self) -> None:
        unhealthy_since: dict[str, float] = {}
        published: tuple[int, int] | None = None  # the devices' and the models' revisions last published
        while not self._stopping.is_set():
            # any change (health here, MPS elsewhere, the models the store holds) is published
            revision = (self.devices.revision(), self._models.revision() if self._models is not None else 0)
            if revision != published and self._publish():
                published = revision
            event = self._backend.next_event(timeout_s=min(self._retry_s, 1.0))
            if event is not None and self.devices.set_health(event.uuid, event.healthy):
                log.warning("gpu=%s healthy=%s reason=%s", event.uuid, event.healthy, event.reason)
            if event is not None and not event.healthy:
                unhealthy_since[event.uuid] = time.monotonic()
            if self._recovery_s > 0:
                for uuid, since in list(unhealthy_since.items()):
                    if time.monotonic() - since >= self._recovery_s:
                        del unhealthy_since[uuid]
                        if self.devices.set_health(uuid, True):
                            log.info("gpu=%s healthy again after %.0fs without errors", uuid, self._recovery_s)

    def inventory(self) -> NodeInventory:
        """The node's inventory as published: the devices, with the models the store holds on each GPU."""
        inventory = self.devices.inventory()
        return inventory if self._models is None else with_held_models(inventory, self._models.held_models())

    def _publish(self) -> bool:
        inventory = self.inventory()
        try:
            if self._publisher.publish_inventory(inventory.node_name, encode_node_inventory(inventory)):
                log.info("published inventory node=%s gpus=%d healthy=%d", inventory.node_name,
                         len(inventory.gpus), len(inventory.healthy_gpus))
            return True
        except Exception as error:  # the API server may be briefly unreachable: retry
            log.warning("publishing inventory node=%s failed: %s", inventory.node_name, error)
            return False
