"""End to end, every component a real process: FaSTPod → controller → pods → the real kube-scheduler
→ our extender binds them with assignments → our node agent's Allocate hands each pod the GPU its
assignment names.

Without the opt-in kubelet tier, no kubelet admits the pods: a stand-in does what kubelet's
device manager does for each pod bound to the node — it calls the node agent's Allocate over
the real device-plugin socket (through the fake kubelet the agent registered with) and records
the answer. The node is created with exactly the simulated GPUs the agent reports, so the
extender and the agent agree on the inventory from the start; it is tainted for this test.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import kubernetes.client
import pytest

from device_plugin._api import deviceplugin_pb2 as api
from device_plugin._api import deviceplugin_pb2_grpc as api_grpc
from device_plugin.discovery import SimulatedGpus
from fastgshare import keys
from fastgshare.codec import decode_assignment
from fastgshare.inventory import parse_gpu_spec
from simgpu import mps as simulated_mps
from tests.cluster.conftest import StartScheduler, unique_name
from tests.cluster.controlplane import ControlPlane, free_ports, wait_until
from tests.cluster.gpu_nodes import create_gpu_node
from tests.cluster.test_controller import Cluster, fastpod_body, install_fastpod_crd
from tests.fake_kubelet import FakeKubelet
from tests.integration.scheduler_extender.harness import ExtenderProcess, scheduler_config

FAKE_GPUS = "2x16GiB:80sm"
TAINT = {"key": "fastgshare.test/e2e", "value": "full-path", "effect": "NoSchedule"}
SHARE = {keys.GPU_QUOTA_REQUEST: "0.4", keys.GPU_QUOTA_LIMIT: "0.6", keys.GPU_SM_PARTITION: "50",
         keys.GPU_MEM: "2Gi"}


def command(name: str) -> str:
    path = shutil.which(name, path=str(Path(sys.executable).parent))
    assert path, f"{name} is not installed next to this Python; run the install step"
    return path


class ProcessGroup:
    """Commands started for one test, each logging to a file, all stopped at the end."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, args: list[str]) -> None:
        with (self.workdir / f"{name}.log").open("wb") as log:
            self.processes[name] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)

    def logs(self) -> str:
        return "\n".join(f"--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-30:])
                         for path in sorted(self.workdir.glob("*.log")))

    def stop_all(self) -> dict[str, int]:
        codes = {}
        for name, process in self.processes.items():
            process.send_signal(signal.SIGTERM)
            try:
                codes[name] = process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                codes[name] = process.wait()
        return codes


class KubeletStandIn:
    """For every pod bound to the node with an assignment and not yet allocated, call Allocate
    (one container) the way kubelet admits a pod, and record the environment it returned."""

    def __init__(self, core: kubernetes.client.CoreV1Api, node: str, kubelet: FakeKubelet) -> None:
        self._core, self._node, self._kubelet = core, node, kubelet
        self.envs: list[dict[str, str]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> KubeletStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        admitted: set[str] = set()
        while not self._stop.wait(0.2):
            pods = self._core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self._node}").items
            for pod in pods:
                assigned = keys.POD_ASSIGNMENT_ANNOTATION in (pod.metadata.annotations or {})
                if pod.metadata.uid in admitted or not assigned:
                    continue
                admitted.add(pod.metadata.uid)
                self._allocate()

    def _allocate(self) -> None:
        request = api.AllocateRequest(container_requests=[api.ContainerAllocateRequest(devices_ids=["any::0"])])
        try:
            with self._kubelet.plugin_channel(keys.DEVICE_PLUGIN_SOCKET) as channel:
                response = api_grpc.DevicePluginStub(channel).Allocate(request, timeout=30)
            self.envs.append(dict(response.container_responses[0].envs))
        except Exception as error:  # recorded, asserted on by the test
            self.errors.append(str(error))


@pytest.fixture
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="fgs-e2e-") as directory:  # short: unix socket paths
        yield Path(directory)


def test_a_fastpod_of_three_ends_with_each_pod_allocated_its_assigned_gpu(
        control_plane: ControlPlane, api_client: kubernetes.client.ApiClient, namespace: str,
        start_scheduler: StartScheduler, workdir: Path) -> None:
    install_fastpod_crd(api_client)
    cluster = Cluster(api_client, namespace)
    node_labels = {TAINT["key"]: TAINT["value"]}
    node = unique_name("e2e-node")
    gpus = SimulatedGpus(parse_gpu_spec(FAKE_GPUS), node).devices()  # what the agent will report
    create_gpu_node(api_client, node, gpus, 4, labels=node_labels)
    cluster.core.patch_node(node, {"spec": {"taints": [TAINT]}})

    plugin_dir = workdir / "dp"
    plugin_dir.mkdir()
    kubelet = FakeKubelet(plugin_dir)
    kubelet.start()
    (port,) = free_ports(1)
    # The stand-in kubelet serves no PodResources API, so the agent tells waiting pods apart only by
    # its marks: binds to the node go one at a time, as the extender's flags say for such agents.
    extender = ExtenderProcess(control_plane.kubeconfig, port, workdir / "extender.log", bind_wait_s=5.0,
                               extra_args=["--bind-window", "1"])
    group = ProcessGroup(workdir)
    kubeconfig = str(control_plane.kubeconfig)
    try:
        simulated_mps.start(workdir / "nvidia-mps")  # the MPS control daemon runs: SM partitions apply
        group.start("node-agent", [command("fastgshare-node-agent"), "--node-name", node, "--kubeconfig", kubeconfig,
                                   "--device-plugin-dir", str(plugin_dir), "--state-dir", str(workdir / "state"),
                                   "--mps-pipe-dir", str(workdir / "nvidia-mps"),
                                   "--fake-gpus", FAKE_GPUS, "--slots-per-gpu", "4", "--hook-library", "/bin/true",
                                   "--metrics-listen", "127.0.0.1:0",
                                   # the key the extender signs with (ExtenderProcess wrote it)
                                   "--assignment-key-file", str(extender.key_file)])
        assert kubelet.wait_for_registrations(1, timeout_s=60), group.logs()
        extender.start()
        start_scheduler(scheduler_config(extender.url))
        group.start("controller", [command("fastgshare-controller"), "--kubeconfig", kubeconfig,
                                   "--namespace", namespace, "--no-leader-elect"])
        body = fastpod_body("resnet", replicas=3, annotations=SHARE)
        body["spec"]["podSpec"].update(tolerations=[{**TAINT, "operator": "Equal"}], nodeSelector=node_labels)

        with KubeletStandIn(cluster.core, node, kubelet) as kubelet_stand_in:
            cluster.create_fastpod(body)

            def all_allocated() -> bool:
                pods = cluster.pods("resnet")
                return len(pods) == 3 and all(
                    keys.POD_ALLOCATED_ANNOTATION in (p.metadata.annotations or {}) for p in pods)

            wait_until(all_allocated, what="3 pods bound, assigned and allocated", timeout_s=240)

        assert kubelet_stand_in.errors == []
        pods = {f"{p.metadata.namespace}/{p.metadata.name}": p for p in cluster.pods("resnet")}
        given = {env[keys.ENV_POD]: env for env in kubelet_stand_in.envs}
        assert set(given) == set(pods)
        for key, pod in pods.items():
            assignment = decode_assignment(pod.metadata.annotations[keys.POD_ASSIGNMENT_ANNOTATION])
            assert pod.spec.node_name == node == assignment.node_name
            env = given[key]
            assert env[keys.ENV_VISIBLE_DEVICES] == assignment.gpu_uuid, key
            assert env[keys.ENV_MPS_THREAD_PERCENTAGE] == "50"
            assert env[keys.ENV_LD_PRELOAD] == keys.CONTAINER_HOOK_PATH
            assert assignment.gpu_uuid in {gpu.uuid for gpu in gpus}
        # Two of 0.4 x 50 % fit one GPU's bin side by side; the third goes next to them or to GPU 1.
        assert len({decode_assignment(p.metadata.annotations[keys.POD_ASSIGNMENT_ANNOTATION]).gpu_uuid
                    for p in pods.values()}) <= 2
    finally:
        codes = group.stop_all()
        extender.stop()
        kubelet.stop()
        cluster.core.delete_node(node)
    assert codes == {"node-agent": 0, "controller": 0}, group.logs()
