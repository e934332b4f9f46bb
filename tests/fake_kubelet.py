"""A fake kubelet for device-plugin tests, written from the v1beta1 reference.

It serves ``v1beta1.Registration`` on ``<dir>/kubelet.sock``; inside ``Register`` it dials the
plugin's endpoint and calls ``GetDevicePluginOptions``, as current kubelets do, so a plugin
that is not serving yet fails to register. :meth:`restart` behaves like kubelet's device
manager on start: every socket in the directory is removed and ``kubelet.sock`` re-created.
"""

from __future__ import annotations

import threading
from concurrent import futures
from pathlib import Path

import grpc

from device_plugin._api import deviceplugin_pb2 as api
from device_plugin._api import deviceplugin_pb2_grpc as api_grpc


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
