"""kubelet's PodResources API (v1 ``List``): which of our devices kubelet gave each pod.

This is kubelet's own record, written the moment an Allocate answer is accepted and before the
next pod is admitted (kubelet admits pods one at a time). The node agent reads it to know
exactly which pods already hold a vGPU slot, instead of trusting its own annotations, which a
crash can leave half-written; and to learn afterwards which pod an Allocate served, from the
device IDs kubelet asked for.

The client answers ``None`` when kubelet does not serve the API (no socket, kubelet older than
1.20, kubelet restarting): the caller then falls back to its annotations and says so once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from pathlib import Path

import attrs
import grpc

from device_plugin._api import podresources_pb2 as api
from device_plugin._api import podresources_pb2_grpc as api_grpc
from fastgshare import keys

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 2.0


@attrs.frozen
class PodDevices:
    """One pod's devices of one resource, per container that has any."""

    namespace: str
    name: str
    containers: Mapping[str, tuple[str, ...]]  # container name -> device IDs

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def devices_of(response: api.ListPodResourcesResponse, resource: str) -> dict[str, PodDevices]:
    """Pod key -> that pod's devices of ``resource``; pods without any are left out."""
    found: dict[str, PodDevices] = {}
    for pod in response.pod_resources:
        containers = {container.name: tuple(device_id for devices in container.devices
                                            if devices.resource_name == resource
                                            for device_id in devices.device_ids)
                      for container in pod.containers}
        containers = {name: ids for name, ids in containers.items() if ids}
        if containers:
            found[f"{pod.namespace}/{pod.name}"] = PodDevices(pod.namespace, pod.name, containers)
    return found


class PodResourcesClient:
    """Lists kubelet's pod resources over its unix socket; one channel, reopened on failure."""

    def __init__(self, socket_path: Path, resource: str, timeout_s: float = CALL_TIMEOUT_S) -> None:
        self.socket_path = socket_path
        self._resource = resource
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._warned = False

    def devices(self) -> dict[str, PodDevices] | None:
        """Every pod holding devices of our resource, or None if kubelet does not answer."""
        with self._lock:
            if not self.socket_path.is_socket():
                self._warn(f"no kubelet PodResources socket at {self.socket_path}")
                return None
            if self._channel is None:
                self._channel = grpc.insecure_channel(f"unix://{self.socket_path}")
            stub = api_grpc.PodResourcesListerStub(self._channel)
            try:
                response = stub.List(api.ListPodResourcesRequest(), timeout=self._timeout_s)
            except grpc.RpcError as error:
                self._channel.close()
                self._channel = None
                self._warn(f"kubelet's PodResources API at {self.socket_path} failed: "
                           f"{error.code().name} {error.details()}")
                return None
            if self._warned:
                log.info("kubelet's PodResources API answers again at %s", self.socket_path)
                self._warned = False
            return devices_of(response, self._resource)

    def close(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
                self._channel = None

    def _warn(self, problem: str) -> None:
        if not self._warned:
            log.warning("%s; until it answers, the pods already given a vGPU are known only by their %s "
                        "annotation, and pods bound at once may be refused at admission: mount kubelet's "
                        "pod-resources directory (deploy/node-agent/daemonset.yaml does), or run the extender with "
                        "--bind-window 1", problem, keys.POD_ALLOCATED_ANNOTATION)
            self._warned = True
