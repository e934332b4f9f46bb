"""Registering with kubelet, and noticing when kubelet restarts.

kubelet's device manager deletes every socket in the device-plugin directory when it starts
and creates a fresh ``kubelet.sock``; the plugin must then serve again and re-register. A
restart shows as our socket vanishing or ``kubelet.sock`` being re-created (a new change
time; the inode number alone is not enough: a re-created socket can get the same one).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import grpc

from device_plugin._api import deviceplugin_pb2 as api
from device_plugin._api import deviceplugin_pb2_grpc as api_grpc
from device_plugin.servicer import OPTIONS
from fastgshare import keys

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"


class RegistrationError(RuntimeError):
    """kubelet refused the registration or could not be reached."""


def register(plugin_dir: Path, endpoint: str, timeout_s: float = 10.0) -> None:
    """Register ``endpoint`` (a socket file name in ``plugin_dir``) for our resource; without
    kubelet's socket there, fail at once saying what to check."""
    if not (plugin_dir / KUBELET_SOCKET).exists():
        raise RegistrationError(
            f"kubelet's device-plugin socket {plugin_dir / KUBELET_SOCKET} does not exist: is the kubelet running "
            "on this node, and is --device-plugin-dir its device-plugin directory (default "
            "/var/lib/kubelet/device-plugins)?")
    target = f"unix://{plugin_dir / KUBELET_SOCKET}"
    request = api.RegisterRequest(version=API_VERSION, endpoint=endpoint, resource_name=keys.VGPU_RESOURCE,
                                  options=OPTIONS)
    try:
        with grpc.insecure_channel(target) as channel:
            api_grpc.RegistrationStub(channel).Register(request, timeout=timeout_s, wait_for_ready=True)
    except grpc.RpcError as error:
        raise RegistrationError(f"registering {keys.VGPU_RESOURCE} with kubelet at {target} failed: "
                                f"{error.code().name}: {error.details()}") from None


def _socket_identity(path: Path) -> tuple[int, int, int] | None:
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return None
    return status.st_ino, status.st_ctime_ns, status.st_mtime_ns


class KubeletWatch:
    """Polls the device-plugin directory for the signs of a kubelet restart."""

    def __init__(self, plugin_dir: Path, own_socket: Path, poll_s: float = 0.5) -> None:
        self._kubelet = plugin_dir / KUBELET_SOCKET
        self._own = own_socket
        self._poll_s = poll_s
        self._seen = _socket_identity(self._kubelet)

    def wait_for_restart(self, stop: threading.Event) -> str | None:
        """Block until kubelet restarted (returns why) or ``stop`` is set (returns None)."""
        while not stop.wait(self._poll_s):
            if not self._own.exists():
                return f"our socket {self._own} was removed"
            current = _socket_identity(self._kubelet)
            if current is not None and current != self._seen:
                return f"{self._kubelet} was re-created"
        return None
