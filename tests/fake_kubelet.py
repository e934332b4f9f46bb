"""A fake kubelet for device-plugin tests, written from the v1beta1 reference.

It serves ``v1beta1.Registration`` on ``<dir>/kubelet.sock``; inside ``Register`` it dials the
plugin's endpoint and calls ``GetDevicePluginOptions``, as current kubelets do, so a plugin
that is not serving yet fails to register. :meth:`restart` behaves like kubelet's device
manager on start: every socket in the directory is removed and ``kubelet.sock`` re-created.

:class:`FakePodResources` serves kubelet's PodResources v1 ``List`` from what a test says kubelet
gave each container, on its own socket, as kubelet does under ``<root>/pod-resources/``.
"""

from __future__ import annotations

import threading
from concurrent import futures
from pathlib import Path

import grpc

from device_plugin._api import deviceplugin_pb2 as api
from device_plugin._api import deviceplugin_pb2_grpc as api_grpc
from device_plugin._api import podresources_pb2 as pr_api
from device_plugin._api import podresources_pb2_grpc as pr_grpc


class _Registration(api_grpc.RegistrationServicer):
    def __init__(self, kubelet: FakeKubelet) -> None:
        self._kubelet = kubelet

    def Register(self, request: api.RegisterRequest, context: grpc.ServicerContext) -> api.Empty:
        if request.version != "v1beta1":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported version {request.version}")
        try:
            with grpc.insecure_channel(f"unix://{self._kubelet.plugin_dir / request.endpoint}") as channel:
                options = api_grpc.DevicePluginStub(channel).GetDevicePluginOptions(api.Empty(), timeout=10)
        except grpc.RpcError as error:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot reach plugin: {error.details()}")
        self._kubelet.record(request, options)
        return api.Empty()


class FakeKubelet:
    def __init__(self, plugin_dir: Path) -> None:
        self.plugin_dir = plugin_dir
        self.registrations: list[tuple[api.RegisterRequest, api.DevicePluginOptions]] = []
        self._registered = threading.Condition()
        self._server: grpc.Server | None = None

    def start(self) -> None:
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        api_grpc.add_RegistrationServicer_to_server(_Registration(self), self._server)
        self._server.add_insecure_port(f"unix://{self.plugin_dir / 'kubelet.sock'}")
        self._server.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(0).wait()
            self._server = None

    def restart(self) -> None:
        """Stop, wipe every socket like kubelet's device manager does, start again."""
        self.stop()
        for path in self.plugin_dir.iterdir():
            if path.is_socket():
                path.unlink()
        self.start()

    def record(self, request: api.RegisterRequest, options: api.DevicePluginOptions) -> None:
        with self._registered:
            self.registrations.append((request, options))
            self._registered.notify_all()

    def wait_for_registrations(self, count: int, timeout_s: float = 15) -> bool:
        with self._registered:
            return self._registered.wait_for(lambda: len(self.registrations) >= count, timeout=timeout_s)

    def plugin_channel(self, endpoint: str) -> grpc.Channel:
        return grpc.insecure_channel(f"unix://{self.plugin_dir / endpoint}")


class FakePodResources(pr_grpc.PodResourcesListerServicer):
    """kubelet's PodResources v1 server: ``List`` answers what :meth:`give` recorded."""

    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
        self.calls = 0
        self._given: dict[tuple[str, str], dict[str, tuple[str, list[str]]]] = {}
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None

    def give(self, namespace: str, name: str, container: str, resource: str, device_ids: list[str]) -> None:
        """kubelet accepted an Allocate answer for this container (it records it before the next admission)."""
        with self._lock:
            self._given.setdefault((namespace, name), {})[container] = (resource, list(device_ids))

    def List(self, request: pr_api.ListPodResourcesRequest,
             context: grpc.ServicerContext) -> pr_api.ListPodResourcesResponse:
        with self._lock:
            self.calls += 1
            return pr_api.ListPodResourcesResponse(pod_resources=[
                pr_api.PodResources(namespace=namespace, name=name, containers=[
                    pr_api.ContainerResources(name=container, devices=[
                        pr_api.ContainerDevices(resource_name=resource, device_ids=ids)])
                    for container, (resource, ids) in containers.items()])
                for (namespace, name), containers in self._given.items()])

    def start(self) -> None:
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pr_grpc.add_PodResourcesListerServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{self.socket_path}")
        self._server.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(0).wait()
            self._server = None
