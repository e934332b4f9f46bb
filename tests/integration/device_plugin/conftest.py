"""The node agent wired with its real gRPC edge on unix sockets, a fake kubelet and fake pods."""

from __future__ import annotations

import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import attrs
import grpc
import pytest

from device_plugin._api import deviceplugin_pb2_grpc as api_grpc
from device_plugin.agent import NodeAgent
from device_plugin.allocation import Allocator, HostPaths, NodePod, SimulatedDriver
from device_plugin.devices import DeviceState
from device_plugin.discovery import SimulatedGpus
from device_plugin.pod_resources import PodResourcesClient
from device_plugin.servicer import DevicePluginServicer
from fastgshare import keys
from fastgshare.inventory import parse_gpu_spec
from simgpu.build import SimGpuBuildError, build
from tests.fake_kubelet import FakeKubelet, FakePodResources

NODE = "gpu-node-1"


class FakePods:
    """An in-memory stand-in for the watch cache, with the same change signalling and bind order."""

    def __init__(self) -> None:
        self._pods: dict[str, NodePod] = {}
        self._version = 0
        self._binds = 0
        self._changed = threading.Condition()

    def put(self, pod: NodePod, *, arrived: bool = True) -> None:
        """Add or change a pod; a new one ``arrived`` through the watch (else it was listed: its
        place in the bind order is unknown)."""
        with self._changed:
            known = self._pods.get(pod.uid)
            if known is not None:
                seq = known.bound_seq
            elif arrived:
                seq, self._binds = self._binds, self._binds + 1
            else:
                seq = None
            self._pods[pod.uid] = attrs.evolve(pod, bound_seq=seq)
            self._version += 1
            self._changed.notify_all()

    def binds_seen(self) -> int:
        with self._changed:
            return self._binds

    def snapshot(self) -> tuple[int, list[NodePod]]:
        with self._changed:
            return self._version, list(self._pods.values())

    def wait_for_change(self, seen_version: int, timeout_s: float) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: self._version != seen_version, timeout=timeout_s)


class FakeMarker:
    """Records allocated marks (shown in the fake cache, as the API server would) and Warning events.
    It has no way to delete a pod: the agent deletes none (issue 42, row 4)."""

    def __init__(self, pods: FakePods) -> None:
        self.marked: list[str] = []
        self.events: list[tuple[str, str, str]] = []  # (pod key, reason, message)
        self.warned = threading.Event()
        self._pods = pods

    def warn(self, pod: NodePod, reason: str, message: str) -> None:
        self.events.append((pod.key, reason, message))
        self.warned.set()

    def mark_allocated(self, pod: NodePod, value: str) -> bool:
        self.marked.append(pod.key)
        self._pods.put(attrs.evolve(pod, annotations={**pod.annotations, keys.POD_ALLOCATED_ANNOTATION: value}))
        return True


class FakePublisher:
    def __init__(self) -> None:
        self.payloads: list[str] = []
        self.published = threading.Event()

    def publish_inventory(self, node_name: str, payload: str) -> bool:
        assert node_name == NODE
        if self.payloads and self.payloads[-1] == payload:
            return False
        self.payloads.append(payload)
        self.published.set()
        return True


@attrs.define
class RunningAgent:
    agent: NodeAgent
    kubelet: FakeKubelet
    gpus: SimulatedGpus
    pods: FakePods
    marker: FakeMarker
    publisher: FakePublisher
    paths: HostPaths
    pod_resources: FakePodResources | None = None

    def stub(self) -> api_grpc.DevicePluginStub:
        channel = self.kubelet.plugin_channel(keys.DEVICE_PLUGIN_SOCKET)
        return api_grpc.DevicePluginStub(channel)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """unix socket paths must stay under ~100 bytes: pytest's tmp_path can be too long."""
    with tempfile.TemporaryDirectory(prefix="fgs-") as directory:
        yield Path(directory)


def _simulated_driver(short_tmp: Path, gpus: SimulatedGpus) -> SimulatedDriver:
    """The simulated driver as the agent installs it (``make -C simgpu``'s build), one state
    directory per GPU under ``short_tmp``."""
    try:
        simgpu = build(sys.executable)
    except SimGpuBuildError as error:
        pytest.fail(str(error))
    gpu_dirs = {gpu.uuid: short_tmp / "fake-gpus" / gpu.uuid for gpu in gpus.devices()}
    for directory in gpu_dirs.values():
        directory.mkdir(parents=True)  # as the agent's start-up does (device_plugin.main.simulated_driver)
    return SimulatedDriver(libcuda=str(simgpu / keys.CUDA_DRIVER_LIBRARY), libnvidia_ml=str(simgpu / keys.NVML_LIBRARY),
                           gpu_dirs={uuid: str(directory) for uuid, directory in gpu_dirs.items()},
                           gpu_memory={gpu.uuid: gpu.memory_bytes for gpu in gpus.devices()})


def _run_agent(short_tmp: Path, pod_resources: FakePodResources | None,
               simulated: bool = False) -> Iterator[RunningAgent]:
    plugin_dir = short_tmp / "dp"
    plugin_dir.mkdir()
    kubelet = FakeKubelet(plugin_dir)
    kubelet.start()
    gpus = SimulatedGpus(parse_gpu_spec("2x16GiB:80sm"), NODE)
    pods, publisher = FakePods(), FakePublisher()
    marker = FakeMarker(pods)
    paths = HostPaths(hook_library=str(short_tmp / "lib" / "libfastgshare-hook.abc.so"),
                      run_dir=str(short_tmp / "run"), mps_pipe_dir="/tmp/nvidia-mps",
                      simulated_driver=_simulated_driver(short_tmp, gpus) if simulated else None)
    devices = DeviceState(NODE, gpus.devices(), slots_per_gpu=4)
    allocator = Allocator(NODE, paths)
    stopping = threading.Event()
    record = None if pod_resources is None else PodResourcesClient(pod_resources.socket_path, keys.VGPU_RESOURCE)
    agent = NodeAgent(
        devices=devices, backend=gpus, publisher=publisher, plugin_dir=plugin_dir, stopping=stopping,
        retry_s=0.2,
        make_servicer=lambda: DevicePluginServicer(devices, allocator, pods, marker, stopping=stopping,
                                                   allocate_wait_s=1.0, kubelet_record=record),
    )
    agent.start()
    assert kubelet.wait_for_registrations(1), "the agent never registered"
    yield RunningAgent(agent, kubelet, gpus, pods, marker, publisher, paths, pod_resources)
    agent.stop()
    kubelet.stop()
    if record is not None:
        record.close()


@pytest.fixture
def running_agent(short_tmp: Path) -> Iterator[RunningAgent]:
    """The agent with a kubelet that has no PodResources API: it relies on its annotations."""
    yield from _run_agent(short_tmp, None)


@pytest.fixture
def simulated_agent(short_tmp: Path) -> Iterator[RunningAgent]:
    """The agent giving GPU containers the simulated driver and their GPU's state (``--fake-driver-dir``)."""
    yield from _run_agent(short_tmp, None, simulated=True)


@pytest.fixture
def exact_agent(short_tmp: Path) -> Iterator[RunningAgent]:
    """The agent with a kubelet that serves PodResources, as kubelet 1.20 and later do."""
    pod_resources = FakePodResources(short_tmp / "pod-resources.sock")
    pod_resources.start()
    try:
        yield from _run_agent(short_tmp, pod_resources)
    finally:
        pod_resources.stop()


def rpc_error(call: object) -> grpc.RpcError:
    """Run a zero-argument callable expected to fail with an RpcError, and return the error."""
    with pytest.raises(grpc.RpcError) as caught:
        call()  # type: ignore[operator]
    return caught.value
