"""The opt-in kubelet tier: Debian's containerd on a private socket plus the built kubelet v1.20.

The kubelet registers a node with the control plane and serves the device-plugin registration
socket, which is enough to test a device plugin against the real thing. Pods never start (no
CNI, no pause image), so the node stays NotReady. Needs root: the kubelet bind-mounts its root
directory, and v1.20 hard-codes the device-plugin directory to
``/var/lib/kubelet/device-plugins`` whatever ``--root-dir`` says, so only one kubelet tier can
run on a machine at a time.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.cluster.controlplane import (
    LOOPBACK,
    Binaries,
    ClusterUnavailable,
    ControlPlane,
    ManagedProcess,
    ProcessSet,
    free_ports,
    http_ok,
    wait_until,
)

DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")  # pluginapi.DevicePluginPath in v1.20
KUBELET_SOCKET = DEVICE_PLUGIN_DIR / "kubelet.sock"


@dataclass(frozen=True)
class KubeletNode:
    """A running kubelet and the node it registered."""

    name: str
    root_dir: Path
    device_plugin_dir: Path
    process: ManagedProcess

    @property
    def kubelet_socket(self) -> Path:
        return self.device_plugin_dir / "kubelet.sock"


def check_prerequisites() -> str:
    """Path of containerd; raises :class:`ClusterUnavailable` saying what is missing."""
    if os.geteuid() != 0:
        raise ClusterUnavailable("the kubelet tier needs root (it bind-mounts its root directory)")
    containerd = shutil.which("containerd")
    if containerd is None or shutil.which("runc") is None:
        raise ClusterUnavailable("containerd or runc not found; apt-get install containerd")
    if _socket_answers(KUBELET_SOCKET):
        raise ClusterUnavailable(f"another kubelet is serving {KUBELET_SOCKET}")
    return containerd


def _socket_answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as sock:
        try:
            sock.connect(str(path))
        except OSError:
            return False
    return True


def start_containerd(containerd: str, workdir: Path, processes: ProcessSet) -> Path:
    """containerd with its socket, state and root in ``workdir``; returns the socket path."""
    workdir.mkdir(parents=True, exist_ok=True)
    sock = workdir / "containerd.sock"
    config = workdir / "containerd.toml"
    config.write_text(f"""\
version = 2
root = "{workdir / 'root'}"
state = "{workdir / 'state'}"
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "{LOOPBACK}"
  stream_server_port = "0"
[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "{workdir / 'cni' / 'bin'}"
  conf_dir = "{workdir / 'cni' / 'net.d'}"
""")
    process = processes.start("containerd", [containerd, f"--config={config}"], workdir / "containerd.log")
    wait_until(lambda: _socket_answers(sock), what="containerd socket", timeout_s=60, watched=process)
    return sock


def start_kubelet(binaries: Binaries, plane: ControlPlane, *, containerd_socket: Path, node_name: str,
                  workdir: Path, processes: ProcessSet) -> KubeletNode:
    """A kubelet registering ``node_name``; returns once its ``/healthz`` answers."""
    root_dir = workdir / "root"
    root_dir.mkdir(parents=True, exist_ok=True)
    port, healthz_port = free_ports(2)
    process = processes.start("kubelet", [
        str(binaries.kubelet), f"--kubeconfig={plane.kubeconfig}", f"--root-dir={root_dir}",
        "--container-runtime=remote", f"--container-runtime-endpoint=unix://{containerd_socket}",
        f"--volume-plugin-dir={workdir / 'volume-plugins'}",
        "--fail-swap-on=false", "--cgroup-driver=cgroupfs", "--cgroups-per-qos=false",
        "--enforce-node-allocatable=", "--eviction-hard=",
        f"--hostname-override={node_name}", f"--node-ip={LOOPBACK}",
        f"--address={LOOPBACK}", f"--port={port}", "--read-only-port=0",
        f"--healthz-bind-address={LOOPBACK}", f"--healthz-port={healthz_port}",
        "--authorization-mode=AlwaysAllow", "--anonymous-auth=false",
    ], workdir / "kubelet.log")
    wait_until(lambda: http_ok(f"http://{LOOPBACK}:{healthz_port}/healthz"),
               what="kubelet /healthz", timeout_s=120, watched=process)
    return KubeletNode(name=node_name, root_dir=root_dir, device_plugin_dir=DEVICE_PLUGIN_DIR, process=process)


def unmount_below(path: Path) -> None:
    """Unmount everything mounted at or below ``path`` (deepest first), e.g. the kubelet's bind mount."""
    prefix = str(path.resolve())
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mount_point = line.split()[4].encode().decode("unicode_escape")
        if mount_point == prefix or mount_point.startswith(prefix + "/"):
            mounts.append(mount_point)
    for mount_point in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "--lazy", mount_point], check=False, capture_output=True)


# Host paths v1.20's kubelet creates whatever its flags say.
HOST_PATHS = (DEVICE_PLUGIN_DIR.parent, Path("/var/log/pods"), Path("/var/log/containers"))


@contextlib.contextmanager
def host_paths_restored() -> Iterator[None]:
    """Remove the :data:`HOST_PATHS` that did not exist before, once the block ends."""
    absent = [path for path in HOST_PATHS if not path.exists()]
    try:
        yield
    finally:
        for path in absent:
            shutil.rmtree(path, ignore_errors=True)
