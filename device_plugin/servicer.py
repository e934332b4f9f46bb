"""The kubelet-facing gRPC edge: the DevicePlugin service and its server on a unix socket.

Translation only: messages in, decisions from :mod:`device_plugin.allocation` and
:mod:`device_plugin.devices`, messages out. kubelet's own record of which pods hold our devices
(:mod:`device_plugin.pod_resources`) tells who still waits, and, after an Allocate the agent
could serve without knowing the pod (every waiting pod got the same answer), which pod it was:
that pod is marked allocated once kubelet shows the request's device IDs on it. With
:mod:`device_plugin.registration` and :mod:`device_plugin.pod_resources`, the only importers of
the generated API code.
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
from device_plugin.allocation import (
    Allocator,
    AmbiguousAllocate,
    Answer,
    Grant,
    NodePod,
    NoPendingPod,
    answer_for,
    given_answer,
    preferred_slots,
)
from device_plugin.devices import DeviceState, SlotDevice
from device_plugin.pod_resources import PodDevices

log = logging.getLogger(__name__)

# PreStartContainer: the check that no container starts with another pod's GPU (see there).
OPTIONS = api.DevicePluginOptions(pre_start_required=True, get_preferred_allocation_available=True)
GIVEN_REMEMBERED = 4096  # device IDs whose answers are kept for PreStartContainer


class PodSource(Protocol):
    """This node's pods as the watch cache sees them."""

    def snapshot(self) -> tuple[int, list[NodePod]]: ...

    def wait_for_change(self, seen_version: int, timeout_s: float) -> bool: ...

    def binds_seen(self) -> int: ...


class PodWriter(Protocol):
    """The agent's two writes about pods: the allocated mark, and Warning events (never a delete)."""

    def mark_allocated(self, pod: NodePod, value: str) -> bool: ...

    def warn(self, pod: NodePod, reason: str, message: str) -> None: ...


REASON_START_REFUSED = "GPUContainerRefused"


class PartitionCheck(Protocol):
    """Told of each pod Allocate served: it warns if the pod's GPU has no MPS to apply its SM
    partition (:meth:`device_plugin.mps_watch.MpsFollower.allocated`)."""

    def allocated(self, pod: NodePod) -> None: ...


class KubeletRecord(Protocol):
    """kubelet's PodResources: pod key -> its devices of our resource; None if kubelet does not answer."""

    def devices(self) -> dict[str, PodDevices] | None: ...


class NoKubeletRecord:
    """For kubelets without the PodResources API: the agent relies on its annotations."""

    def devices(self) -> dict[str, PodDevices] | None:
        return None


class _Refused(NoPendingPod):
    """The pod being admitted cannot be served (its GPU is gone or unhealthy)."""


AMBIGUITY_WAIT_S = 3.0  # a refused pod of an earlier Allocate turns Failed meanwhile, ending the doubt
OWNER_WAIT_S = 10.0  # how long to look in kubelet's record for the pod an unnamed Allocate served


def _list_response(slots: list[SlotDevice]) -> api.ListAndWatchResponse:
    return api.ListAndWatchResponse(devices=[api.Device(ID=slot.id, health=slot.health) for slot in slots])


class DevicePluginServicer(api_grpc.DevicePluginServicer):
    def __init__(self, devices: DeviceState, allocator: Allocator, pods: PodSource, marker: PodWriter,
                 *, allocate_wait_s: float = 10.0, stopping: threading.Event,
                 kubelet_record: KubeletRecord | None = None, partitions: PartitionCheck | None = None,
                 now: Callable[[], datetime] = lambda: datetime.now(UTC),
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._devices = devices
        self._allocator = allocator
        self._pods = pods
        self._marker = marker
        self._kubelet_record = kubelet_record or NoKubeletRecord()
        self._partitions = partitions
        self._allocate_wait_s = allocate_wait_s
        self._stopping = stopping
        self._now = now
        self._monotonic = monotonic
        self._allocate_lock = threading.Lock()  # one Allocate at a time: pods are served in order
        self._given: dict[str, tuple[Answer, bool]] = {}  # device ID -> what its container got, with MPS
        # A servicer is made each time kubelet (re)starts: kubelet lists the pods already bound and
        # admits them by creation time, so only pods arriving from now on come in a known order.
        self._order_from = pods.binds_seen()

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
            gpu_uuid: str | None = self._allocator.peek(pods, self._held(pods),
                                                        order_from=self._order_from).presumed.assignment.gpu_uuid
        except NoPendingPod:
            gpu_uuid = None
        return api.PreferredAllocationResponse(container_responses=[
            api.ContainerPreferredAllocationResponse(deviceIDs=preferred_slots(
                req.available_deviceIDs, req.must_include_deviceIDs, req.allocation_size, gpu_uuid))
            for req in request.container_requests
        ])

    def Allocate(self, request: api.AllocateRequest, context: grpc.ServicerContext) -> api.AllocateResponse:
        containers = len(request.container_requests)
        device_ids = [device_id for r in request.container_requests for device_id in r.devices_ids]
        with self._allocate_lock:
            try:
                grant = self._grant(containers)
            except NoPendingPod as refusal:
                log.warning("allocate refused node=%s devices=%s reason=%s", self._devices.node_name,
                            device_ids, refusal)
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(refusal))
            self._finish(grant, device_ids)
            gpu = self._devices.gpu(grant.candidate.assignment.gpu_uuid)
            mps = gpu is not None and gpu.mps_enabled
            for request_ids, allocation in zip(request.container_requests, grant.containers, strict=True):
                for device_id in request_ids.devices_ids:
                    self._given[device_id] = (given_answer(allocation), mps)
            while len(self._given) > GIVEN_REMEMBERED:
                del self._given[next(iter(self._given))]
        if self._partitions is not None and grant.choice.certain:
            self._partitions.allocated(grant.candidate.pod)
        return api.AllocateResponse(container_responses=[
            api.ContainerAllocateResponse(
                envs=dict(allocation.envs),
                mounts=[api.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
                        for m in allocation.mounts])
            for allocation in grant.containers
        ])

    def PreStartContainer(self, request: api.PreStartContainerRequest,
                          context: grpc.ServicerContext) -> api.PreStartContainerResponse:
        """The last check before a container starts: kubelet's record now names the pod holding
        these devices; if what Allocate gave them is not what that pod is assigned and trusted for
        (kubelet admitted a pod the agent did not expect, or the pod's assignment is not the
        extender's), that container does not start, and a Warning event on that pod says why.

        The agent deletes no pod (issue 42, row 4: a forged pod must not make it delete innocent
        ones): kubelet keeps Allocate's answer for the pod's life and retries the start, so the pod
        waits until its owner deletes it (a FaSTPod's controller replaces a pod that does not start)."""
        if (refusal := self._wrong_answer(list(request.devices_ids))) is not None:
            pod, problem = refusal
            log.warning("pre-start refused pod=%s devices=%s reason=%s", pod.key, list(request.devices_ids), problem)
            self._marker.warn(pod, REASON_START_REFUSED, problem)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, problem)
        return api.PreStartContainerResponse()

    def _wrong_answer(self, device_ids: list[str]) -> tuple[NodePod, str] | None:
        given = [self._given[d] for d in device_ids if d in self._given]
        record = self._kubelet_record.devices()
        if not given or record is None:
            return None  # answered before this agent started, or no record to check against
        owner = next((held for held in record.values()
                      if set(device_ids) <= {d for ids in held.containers.values() for d in ids}), None)
        _, pods = self._pods.snapshot()
        pod = next((p for p in pods if owner is not None and p.key == owner.key), None)
        if pod is None:
            return None
        answer, mps = given[0]
        if answer == answer_for(pod, self._allocator.paths, mps):
            return None
        assignment = pod.assignment
        assigned = (f"no GPU the node agent serves ({pod.assignment_problem or 'no assignment'})" if assignment is None
                    else f"GPU {assignment.gpu_uuid}, SM {assignment.share.sm_percent}%")
        remedy = ("Delete the pod and create it again" if pod.controller is None
                  else f"delete the pod and {pod.controller} makes a new one")
        return pod, (f"fastgshare: refused to start a container of pod {pod.key}: Allocate gave it another pod's GPU "
                     f"or SM percentage ({dict(answer[0]).get('NVIDIA_VISIBLE_DEVICES')}), while the pod is assigned "
                     f"{assigned}; kubelet admitted a pod the node agent did not expect. {remedy}")

    def _held(self, pods: list[NodePod]) -> dict[str, int] | None:
        """kubelet's record as pod key -> GPU containers served; None without one. Marks pods
        kubelet fully served that carry no mark yet (a crash between answer and mark)."""
        record = self._kubelet_record.devices()
        if record is None:
            return None
        for pod in pods:
            held = record.get(pod.key)
            if (held is not None and not pod.allocated and not pod.deleting
                    and len(held.containers) >= max(len(pod.gpu_containers), 1)):
                self._mark(pod, "kubelet shows its devices")
        return {key: len(held.containers) for key, held in record.items()}

    def _grant(self, containers: int) -> Grant:
        """Serve the next pod, waiting up to ``allocate_wait_s`` for the cache to show it (and up
        to ``AMBIGUITY_WAIT_S`` for a doubt between waiting pods to clear)."""
        started = self._monotonic()
        while True:
            version, pods = self._pods.snapshot()
            try:
                held = self._held(pods)
                choice = self._allocator.peek(pods, held, order_from=self._order_from)
                candidate = choice.presumed
                gpu = self._devices.gpu(candidate.assignment.gpu_uuid)
                problem = (f"which node {self._devices.node_name} does not have" if gpu is None
                           else None if gpu.healthy else "which is unhealthy")
                if gpu is None or problem is not None:
                    if choice.certain:
                        self._allocator.refuse(candidate)
                    raise _Refused(f"pod {candidate.pod.key} is assigned GPU {candidate.assignment.gpu_uuid}, "
                                   f"{problem}")
                return self._allocator.grant(pods, containers, gpu.mps_enabled, held, self._order_from)
            except _Refused:
                raise  # this pod is the one kubelet admits: waiting would serve the next one instead
            except NoPendingPod as refusal:
                wait_s = AMBIGUITY_WAIT_S if isinstance(refusal, AmbiguousAllocate) else self._allocate_wait_s
                remaining = started + wait_s - self._monotonic()
                if remaining <= 0 or not self._pods.wait_for_change(version, remaining):
                    raise

    def _finish(self, grant: Grant, device_ids: list[str]) -> None:
        choice, gpu = grant.choice, grant.candidate.assignment.gpu_uuid
        waiting = [c.pod.key for c in choice.waiting]
        log.info("allocated pod=%s gpu=%s containers=%d complete=%s", waiting[0] if choice.certain else waiting,
                 gpu, len(grant.containers), grant.pod_complete)
        if choice.certain or isinstance(self._kubelet_record, NoKubeletRecord):
            if grant.pod_complete:
                self._mark(grant.candidate.pod, "served")
            return
        # Every waiting pod got the same answer; kubelet records which one it was as soon as this
        # answer reaches it, under the device IDs it asked for.
        threading.Thread(target=self._mark_owner, args=(device_ids,), name="allocate-owner", daemon=True).start()

    def _mark_owner(self, device_ids: list[str]) -> None:
        deadline = self._monotonic() + OWNER_WAIT_S
        wanted = set(device_ids)
        while self._monotonic() < deadline and not self._stopping.is_set():
            record = self._kubelet_record.devices() or {}
            owner = next((held for held in record.values()
                          if wanted <= {d for ids in held.containers.values() for d in ids}), None)
            if owner is not None:
                _, pods = self._pods.snapshot()
                pod = next((p for p in pods if p.key == owner.key), None)
                if pod is not None and len(owner.containers) >= max(len(pod.gpu_containers), 1):
                    log.info("kubelet shows devices=%s on pod=%s", device_ids, pod.key)
                    self._mark(pod, "kubelet shows its devices")
                return
            self._stopping.wait(0.05)
        log.warning("kubelet never showed devices=%s on a pod; the pod is marked when the next Allocate looks",
                    device_ids)

    def _mark(self, pod: NodePod, why: str) -> None:
        if not self._marker.mark_allocated(pod, self._now().isoformat()):
            log.warning("pod=%s vanished or was replaced before it could be marked allocated (%s)", pod.key, why)


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
