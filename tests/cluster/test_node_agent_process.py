"""``fastgshare-node-agent`` as a real process against the real API server and a fake kubelet."""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import kubernetes.client
import pytest

from device_plugin._api import deviceplugin_pb2 as api
from device_plugin._api import deviceplugin_pb2_grpc as api_grpc
from device_plugin.arbiter.client import ArbiterError, HookClient
from fastgshare import keys
from fastgshare.codec import decode_node_inventory
from simgpu import mps as simulated_mps
from tests.builders import TEST_ASSIGNMENT_KEY
from tests.cluster.conftest import unique_name
from tests.cluster.controlplane import ControlPlane, wait_until
from tests.fake_kubelet import FakeKubelet


@pytest.fixture
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="fgs-agent-") as directory:
        yield Path(directory)


def agent_command(node: str, plane: ControlPlane, plugin_dir: Path, state_dir: Path, gpus: str,
                  *extra: str) -> list[str]:
    """``fastgshare-node-agent`` for ``node`` with simulated GPUs, a stand-in hook, metrics on a free port
    and the tests' assignment key (tests.builders), written next to ``state_dir``."""
    agent_bin = shutil.which("fastgshare-node-agent", path=str(Path(sys.executable).parent))
    assert agent_bin, "fastgshare-node-agent is not installed"
    key_file = state_dir.parent / "assignment-key"
    key_file.write_bytes(TEST_ASSIGNMENT_KEY)
    return [agent_bin, "--node-name", node, "--kubeconfig", str(plane.kubeconfig), "--device-plugin-dir",
            str(plugin_dir), "--state-dir", str(state_dir), "--fake-gpus", gpus, "--hook-library", "/bin/true",
            "--metrics-listen", "127.0.0.1:0", "--assignment-key-file", str(key_file), *extra]


@contextlib.contextmanager
def running_agent(core: kubernetes.client.CoreV1Api, node: str, plugin_dir: Path,
                  command: list[str]) -> Iterator[tuple[subprocess.Popen[bytes], FakeKubelet]]:
    """A fake kubelet on ``plugin_dir`` and the agent ``command`` (its output in ``agent.log`` next to
    ``plugin_dir``); afterwards, also when the test failed: the agent killed if it still runs, the
    kubelet stopped and ``node`` deleted if it exists."""
    plugin_dir.mkdir()
    kubelet = FakeKubelet(plugin_dir)
    kubelet.start()
    try:
        with (plugin_dir.parent / "agent.log").open("w") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
            try:
                yield process, kubelet
            finally:
                if process.poll() is None:
                    process.kill()
                    process.wait()
    finally:
        kubelet.stop()
        with contextlib.suppress(kubernetes.client.ApiException):  # a test may fail before it makes the node
            core.delete_node(node)


def test_agent_process_registers_publishes_serves_and_stops_cleanly(
        control_plane: ControlPlane, core: kubernetes.client.CoreV1Api, workdir: Path) -> None:
    node = unique_name("process-node")
    core.create_node(kubernetes.client.V1Node(metadata=kubernetes.client.V1ObjectMeta(name=node)))
    plugin_dir, state_dir = workdir / "dp", workdir / "state"
    command = agent_command(node, control_plane, plugin_dir, state_dir, "2x40GiB:108sm", "--slots-per-gpu", "4")
    with running_agent(core, node, plugin_dir, command) as (process, kubelet):
        assert kubelet.wait_for_registrations(1, timeout_s=30), (workdir / "agent.log").read_text()
        wait_until(lambda: keys.NODE_GPU_INFO_ANNOTATION in (core.read_node(node).metadata.annotations or {}),
                   what="the inventory annotation", timeout_s=30)
        inventory = decode_node_inventory(core.read_node(node).metadata.annotations[keys.NODE_GPU_INFO_ANNOTATION])
        assert [(g.index, g.memory_bytes, g.sm_count) for g in inventory.gpus] == [(0, 40 * 2**30, 108),
                                                                                  (1, 40 * 2**30, 108)]
        with kubelet.plugin_channel(keys.DEVICE_PLUGIN_SOCKET) as channel:
            first = next(api_grpc.DevicePluginStub(channel).ListAndWatch(api.Empty(), timeout=10))
        assert len(first.devices) == 8
        installed = list((state_dir / "lib").glob("libfastgshare-hook.*.so"))
        assert len(installed) == 1
        # The arbiter listens and, outside a pod's cgroup, refuses to serve this test process.
        client = HookClient(state_dir / "run" / keys.ARBITER_SOCKET_NAME)
        with pytest.raises(ArbiterError, match="belongs to no pod"):
            client.hello("team/anything")
        client.close()

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        assert not (plugin_dir / keys.DEVICE_PLUGIN_SOCKET).exists()
        assert not (state_dir / "run" / keys.ARBITER_SOCKET_NAME).exists()
        assert "node agent stopped" in (workdir / "agent.log").read_text()


def test_a_node_name_that_is_not_in_the_cluster_stops_the_agent_saying_so(
        control_plane: ControlPlane, workdir: Path) -> None:
    """Issue 15, defect 7: a wrong --node-name left the agent running and failing to publish forever.
    It waits a while (the kubelet may still be registering the node), saying why, then stops."""
    (workdir / "dp").mkdir()
    result = subprocess.run(
        agent_command("no-such-node", control_plane, workdir / "dp", workdir / "state", "1x40GiB:108sm",
                      "--node-wait-seconds", "2"),
        capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert ("node 'no-such-node' is not in the cluster: --node-name (or $NODE_NAME) must be this machine's "
            "Kubernetes node name (kubectl get nodes; the DaemonSet passes spec.nodeName); waiting for the kubelet "
            "to register it") in result.stderr
    assert result.stderr.strip().splitlines()[-1].endswith(
        "node 'no-such-node' is not in the cluster: --node-name (or $NODE_NAME) must be this machine's "
        "Kubernetes node name (kubectl get nodes; the DaemonSet passes spec.nodeName)")


def test_the_agent_waits_for_a_node_the_kubelet_registers_late(
        control_plane: ControlPlane, core: kubernetes.client.CoreV1Api, workdir: Path) -> None:
    """The agent may start before the kubelet has registered its node (fastgshare cluster up does)."""
    node = unique_name("late-node")
    plugin_dir = workdir / "dp"
    command = agent_command(node, control_plane, plugin_dir, workdir / "state", "1x40GiB:108sm")
    with running_agent(core, node, plugin_dir, command) as (process, kubelet):
        wait_until(lambda: "waiting for the kubelet to register it" in (workdir / "agent.log").read_text(),
                   what="the agent to say it waits for its node", timeout_s=30)
        core.create_node(kubernetes.client.V1Node(metadata=kubernetes.client.V1ObjectMeta(name=node)))
        assert kubelet.wait_for_registrations(1, timeout_s=60), (workdir / "agent.log").read_text()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0


def _mps_view(core: kubernetes.client.CoreV1Api, node: str) -> tuple[list[bool], list[float], list[str]]:
    """What the cluster sees of the node's MPS: the inventory's per GPU, the agent's
    fastgshare_gpu_mps_active per GPU (in GPU order) and the reasons of the Node's events."""
    metadata = core.read_node(node).metadata
    annotations = (metadata.annotations if metadata is not None else None) or {}
    if keys.NODE_GPU_INFO_ANNOTATION not in annotations:
        return [], [], []
    gpus = decode_node_inventory(annotations[keys.NODE_GPU_INFO_ANNOTATION]).gpus
    port = annotations[keys.NODE_METRICS_PORT_ANNOTATION]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        lines = response.read().decode().splitlines()
    gauge = {gpu.uuid: float(line.rsplit(" ", 1)[1]) for line in lines for gpu in gpus
             if line.startswith(f'fastgshare_gpu_mps_active{{gpu="{gpu.uuid}"}}')}
    events = core.list_namespaced_event("default", field_selector=f"involvedObject.name={node}").items
    reasons = [str(event.reason) for event in sorted(events, key=lambda e: str(e.first_timestamp))
               if event.involved_object.kind == "Node"]
    return [gpu.mps_enabled for gpu in gpus], [gauge.get(gpu.uuid, -1.0) for gpu in gpus], reasons


def test_mps_turned_on_and_off_under_a_running_agent_reaches_inventory_metric_and_events(
        control_plane: ControlPlane, core: kubernetes.client.CoreV1Api, workdir: Path) -> None:
    """Issue 36, item 4: the agent starts before the MPS control daemon (the simulated one,
    simgpu/mps.py), then the daemon comes and goes; the cluster sees each change."""
    node = unique_name("mps-node")
    core.create_node(kubernetes.client.V1Node(metadata=kubernetes.client.V1ObjectMeta(name=node)))
    plugin_dir, state_dir, pipe_dir = workdir / "dp", workdir / "state", workdir / "nvidia-mps"
    command = agent_command(node, control_plane, plugin_dir, state_dir, "2x40GiB:108sm", "--mps-pipe-dir",
                            str(pipe_dir), "--metrics-auth", "none")
    with running_agent(core, node, plugin_dir, command) as (process, _kubelet), \
            contextlib.ExitStack() as cleanup:
        cleanup.callback(simulated_mps.stop, pipe_dir)
        def seen(expected: tuple[list[bool], list[float], list[str]]) -> bool:
            return _mps_view(core, node) == expected

        wait_until(lambda: seen(([False, False], [0.0, 0.0], [])), what="the GPUs published without MPS",
                   timeout_s=30)
        simulated_mps.start(pipe_dir)
        wait_until(lambda: seen(([True, True], [1.0, 1.0], ["MPSStarted"])), what="MPS started, seen by the cluster",
                   timeout_s=30)
        simulated_mps.stop(pipe_dir)
        wait_until(lambda: seen(([False, False], [0.0, 0.0], ["MPSStarted", "MPSStopped"])),
                   what="MPS stopped, seen by the cluster", timeout_s=30)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
