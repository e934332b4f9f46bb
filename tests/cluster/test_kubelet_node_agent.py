"""Opt-in kubelet tier: the real kubelet registers our device plugin and the Node shows the capacity."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import kubernetes.client
import pytest

from fastgshare import keys
from tests.cluster.controlplane import ControlPlane, wait_until
from tests.cluster.kubelet import KubeletNode

pytestmark = pytest.mark.kubelet


def test_real_kubelet_registers_the_plugin_and_the_node_shows_capacity(
        kubelet_node: KubeletNode, control_plane: ControlPlane, core: kubernetes.client.CoreV1Api) -> None:
    wait_until(kubelet_node.kubelet_socket.is_socket, what="kubelet.sock", timeout_s=120,
               watched=kubelet_node.process)
    agent_bin = shutil.which("fastgshare-node-agent", path=str(Path(sys.executable).parent))
    assert agent_bin, "fastgshare-node-agent is not installed"
    with tempfile.TemporaryDirectory(prefix="fgs-kubelet-agent-") as state:
        log_path = Path(state) / "agent.log"
        with log_path.open("w") as log:
            agent = subprocess.Popen(
                [agent_bin, "--node-name", kubelet_node.name, "--kubeconfig", str(control_plane.kubeconfig),
                 "--device-plugin-dir", str(kubelet_node.device_plugin_dir), "--state-dir", state,
                 "--fake-gpus", "2x16GiB:80sm", "--slots-per-gpu", "4", "--hook-library", "/bin/true"],
                stdout=log, stderr=subprocess.STDOUT)
            try:
                def advertised() -> bool:
                    status = core.read_node(kubelet_node.name).status
                    return (status.capacity or {}).get(keys.VGPU_RESOURCE) == "8" and \
                        (status.allocatable or {}).get(keys.VGPU_RESOURCE) == "8"

                wait_until(advertised, what=f"node capacity of {keys.VGPU_RESOURCE} = 8", timeout_s=90,
                           watched=kubelet_node.process)
            finally:
                agent.send_signal(signal.SIGTERM)
                agent.wait(30)
        assert "registered with kubelet" in log_path.read_text()
