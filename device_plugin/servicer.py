"""The kubelet-facing gRPC edge: the DevicePlugin service and its server on a unix socket.

Translation only: messages in, decisions from :mod:`device_plugin.allocation` and
:mod:`device_plugin.devices`, messages out. Together with :mod:`device_plugin.registration`
the only importer of the generated API code.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import grpc

from device_plugin._api import deviceplugin_pb2 as api
from device_plugin._api import deviceplugin_pb2_grpc as api_grpc
from device_plugin.allocation import Allocator, Grant, NoPendingPod, PodRecord, preferred_slots
from device_plugin.devices import DeviceState, SlotDevice

log = logging.getLogger(__name__)

OPTIONS = api.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)


class PodSource(Protocol):
    """This node's pods as the watch cache sees them."""

    def snapshot(self) -> tuple[int, list[PodRecord]]: ...

    def wait_for_change(self, seen_version: int, timeout_s: float) -> bool: ...


class AllocationMarker(Protocol):
    def mark_allocated(self, pod: PodRecord, value: str) -> bool: ...


def _list_response(slots: list[SlotDevice]) -> api.ListAndWatchResponse:
    return api.ListAndWatchResponse(devices=[api.Device(ID=slot.id, health=slot.health) for slot in slots])


class DevicePluginServicer(api_grpc.DevicePluginServicer):
    def __init__(self, devices: DeviceState, allocator: Allocator, pods: PodSource, marker: AllocationMarker,
                 *, allocate_wait_s: float = 10.0, stopping: threading.Event,
                 now: Callable[[], datetime] = lambda: datetime.now(UTC),
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._devices = devices
        self._allocator = allocator
        self._pods = pods
        self._marker = marker
        self._allocate_wait_s = allocate_wait_s
        self._stopping = stopping
        self._now = now
        self._monotonic = monotonic
        self._allocate_lock = threading.Lock()  # one Allocate at a time: pods are served in order

    def GetDevicePluginOptions(self, request: api.Empty, context: grpc.ServicerContext) -> api.DevicePluginOptions:
        return OPTIONS

    def ListAndWatch(self, request: api.Empty, context: grpc.ServicerContext) -> Iterator[api.ListAndWatchResponse]:
        updates = self._devices.subscribe()
        log.info("kubelet opened ListAndWatch node=%s", self._devices.node_name)
        try:
            while context.is_active() and not self._stopping.is_set():
                try:
                    slots = updates.get(timeout=0.5)
                except queue.Empty:  # check the stream and the stop flag again
                    continue
                healthy = sum(1 for slot in slots if slot.healthy)
                log.info("sending device list node=%s devices=%d healthy=%d", self._devices.node_name,
                         len(slots), healthy)
                yield _list_response(slots)
        finally:
            self._devices.unsubscribe(updates)

    def GetPreferredAllocation(self, request: api.PreferredAllocationRequest,
                               context: grpc.ServicerContext) -> api.PreferredAllocationResponse:
        _, pods = self._pods.snapshot()
        try:
            gpu_uuid: str | None = self._allocator.peek(pods).assignment.gpu_uuid
        except NoPendingPod:
            gpu_uuid = None
        return api.PreferredAllocationResponse(container_responses=[
            api.ContainerPreferredAllocationResponse(deviceIDs=preferred_slots(
                req.available_deviceIDs, req.must_include_deviceIDs, req.allocation_size, gpu_uuid))
            for req in request.container_requests
        ])

    def Allocate(self, request: api.AllocateRequest, context: grpc.ServicerContext) -> api.AllocateResponse:
        containers = len(request.container_requests)
        with self._allocate_lock:
            try:
                grant = self._grant(containers)
            except NoPendingPod as refusal:
                log.warning("allocate refused node=%s devices=%s reason=%s", self._devices.node_name,
                            [list(r.devices_ids) for r in request.container_requests], refusal)
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(refusal))
            self._finish(grant)
        return api.AllocateResponse(container_responses=[
            api.ContainerAllocateResponse(
                envs=dict(allocation.envs),
                mounts=[api.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
                        for m in allocation.mounts])
            for allocation in grant.containers
        ])

    def PreStartContainer(self, request: api.PreStartContainerRequest,
                          context: grpc.ServicerContext) -> api.PreStartContainerResponse:
        return api.PreStartContainerResponse()

    def _grant(self, containers: int) -> Grant:
        """Serve the next pod, waiting up to ``allocate_wait_s`` for the cache to show it."""
        deadline = self._monotonic() + self._allocate_wait_s
        while True:
            version, pods = self._pods.snapshot()
            try:
                candidate = self._allocator.peek(pods)
                gpu = self._devices.gpu(candidate.assignment.gpu_uuid)
                if gpu is None:
                    raise NoPendingPod(f"pod {candidate.pod.key} is assigned GPU {candidate.assignment.gpu_uuid}, "
                                       f"which node {self._devices.node_name} does not have")
                if not gpu.healthy:
                    raise NoPendingPod(f"pod {candidate.pod.key} is assigned GPU {gpu.uuid}, which is unhealthy")
                return self._allocator.grant(pods, containers, gpu.mps_enabled)
            except NoPendingPod:
                remaining = deadline - self._monotonic()
                if remaining <= 0 or not self._pods.wait_for_change(version, remaining):
                    raise

    def _finish(self, grant: Grant) -> None:
        pod, gpu = grant.candidate.pod, grant.candidate.assignment.gpu_uuid
        log.info("allocated pod=%s gpu=%s containers=%d complete=%s", pod.key, gpu, len(grant.containers),
                 grant.pod_complete)
        if grant.pod_complete and not self._marker.mark_allocated(pod, self._now().isoformat()):
            log.warning("pod=%s vanished or was replaced before it could be marked allocated", pod.key)


class PluginServer:
    """The gRPC server on the plugin's unix socket; the socket file is removed on stop."""

    def __init__(self, servicer: DevicePluginServicer, socket_path: Path, workers: int = 8) -> None:
        self.socket_path = socket_path
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="plugin"))
        api_grpc.add_DevicePluginServicer_to_server(servicer, self._server)

    def start(self) -> None:
        self.socket_path.unlink(missing_ok=True)
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        if self._server.add_insecure_port(f"unix://{self.socket_path}") == 0:
            raise OSError(f"cannot listen on {self.socket_path}")
        self._server.start()

    def stop(self, grace_s: float = 1.0) -> None:
        self._server.stop(grace_s).wait()
        self.socket_path.unlink(missing_ok=True)
