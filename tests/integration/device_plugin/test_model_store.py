"""The model store on a simulated GPU, as real processes: a worker loads a file once, importers
(ctypes on the simulated driver, tests/integration/simgpu/ipc_probe.py) map the handle and read the
file's bytes, the GPU counts the weights once; freed after the grace period (a fake clock); a
worker killed with SIGKILL leaves the importers' mappings readable (the simulated GPU's documented
behaviour) and the next acquire reloads; a restarted store adopts the running worker; the
pod-facing socket refuses with one line. Every process a test starts is killed at its end, also
when it fails."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from device_plugin.allocation import NodePod, SimulatedDriver
from device_plugin.models import protocol
from device_plugin.models.access import ModelAccessServer
from device_plugin.models.store import ModelStore, ProcessWorkers, WorkerGone, simulated_driver_dir, worker_env
from fastgshare import keys
from fastgshare.model import ModelSpec, model_annotation
from simgpu.build import SimGpuBuildError, build
from simgpu.state import read_state
from tests.builders_k8s import assignment, pod_record
from tests.integration.device_plugin.conftest import NODE, FakePods
from tests.probe_process import ProbeProcess

PROBE = Path(__file__).resolve().parents[1] / "simgpu" / "ipc_probe.py"
GPU = "GPU-5a1e0000-0000-4000-8000-00000000d0d0"
GPU_MEMORY = 1 << 30
SIZE = (3 << 20) + 4097  # not a multiple of the chunk, the 2 MiB span or a page
SPEC = ModelSpec(name="resnet", bytes=SIZE, path="resnet/weights.bin")
SUCCESS, INVALID_VALUE = 0, 1


@attrs.frozen
class Clock:
    now: list[float] = attrs.field(factory=lambda: [1000.0])

    def __call__(self) -> float:
        return self.now[0]

    def advance(self, seconds: float) -> None:
        self.now[0] += seconds


@attrs.define
class Node:
    """One simulated GPU, its model directory, pods and the store's workers."""

    root: Path
    gpu_dir: Path
    driver: Path
    model_dir: Path
    weights: bytes
    pods: FakePods
    workers: ProcessWorkers
    clock: Clock
    started: list[subprocess.Popen[str]] = attrs.field(factory=list)

    def store(self) -> ModelStore:
        return ModelStore(node_name=NODE, model_dir=self.model_dir, gpus=(GPU,), pods=self.pods,
                          workers=self.workers, grace_s=300, clock=self.clock, sweep_s=3600)

    def worker_pid(self) -> int | None:
        try:
            pid, _ = protocol.parse_list_answer(self.workers.call(GPU, {"op": "list"}, 5.0))
        except WorkerGone:
            return None
        return pid

    def importer(self) -> Importer:
        importer = Importer(self.driver, self.gpu_dir)
        self.started.append(importer.process)
        return importer


class Importer(ProbeProcess):
    """A pod's process mapping the weights: ipc_probe.py on the same simulated GPU."""

    def __init__(self, driver: Path, gpu_dir: Path) -> None:
        env = {**os.environ, "SIMGPU_DRIVER": str(driver / keys.CUDA_DRIVER_LIBRARY),
               keys.ENV_FAKE_GPU_DIR: str(gpu_dir), keys.ENV_FAKE_GPU_MEMORY: str(GPU_MEMORY)}
        super().__init__([sys.executable, str(PROBE)], env, "ipc_probe")

    def reads(self, name: str, weights: bytes) -> bool:
        """The mapping reads the file's bytes: its head, a window across the 2 MiB span, its tail."""
        for offset, length in ((0, 8192), ((2 << 20) - 4096, 8192), (len(weights) - 5000, 5000)):
            answer = self("read", name=name, size=length, offset=offset)
            if answer["result"] != SUCCESS or bytes.fromhex(answer["data"]) != weights[offset:offset + length]:
                return False
        return True


@pytest.fixture(scope="module")
def simgpu() -> Path:
    try:
        return build(sys.executable)
    except SimGpuBuildError as error:
        pytest.fail(str(error))


@pytest.fixture
def node(short_tmp: Path, simgpu: Path) -> Iterator[Node]:
    gpu_dir, model_dir = short_tmp / "gpu", short_tmp / "models"
    gpu_dir.mkdir()
    (model_dir / "resnet").mkdir(parents=True)
    weights = os.urandom(SIZE)
    (model_dir / SPEC.path).write_bytes(weights)
    driver = SimulatedDriver(libcuda=str(simgpu / keys.CUDA_DRIVER_LIBRARY),
                             libnvidia_ml=str(simgpu / keys.NVML_LIBRARY), gpu_dirs={GPU: str(gpu_dir)},
                             gpu_memory={GPU: GPU_MEMORY})
    lib_dir = simulated_driver_dir(driver, short_tmp / "state" / "models" / "driver")
    workers = ProcessWorkers(short_tmp / "state" / "models", {GPU: worker_env(GPU, driver, lib_dir)},
                             idle_exit_s=1.0)
    built = Node(short_tmp, gpu_dir, simgpu, model_dir, weights, FakePods(), workers, Clock())
    try:
        yield built
    finally:
        for process in built.started:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)
        pid = built.worker_pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
        workers.kill_started()


def model_pod(name: str, spec: ModelSpec | None = SPEC, function: str = "fn") -> NodePod:
    record = pod_record(name, NODE, assigned=assignment(NODE, GPU))
    annotations = dict(record.annotations)
    if spec is not None:
        annotations[keys.MODEL_ANNOTATION] = model_annotation(function, spec)
    return attrs.evolve(record, annotations=annotations)


def gpu_memory_used(gpu_dir: Path) -> int:
    return read_state(gpu_dir).mem_used


def wait_until_gone(pid: int, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists() or "zombie" in _state(pid):
            return True
        time.sleep(0.05)
    return False


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:", 1)[1].split("\n", 1)[0]
    except (OSError, IndexError):
        return "zombie"  # gone meanwhile


def test_one_load_two_importers_read_the_files_bytes_counted_once(node: Node) -> None:
    a, b = model_pod("a"), model_pod("b")
    node.pods.put(a)
    node.pods.put(b)
    store = node.store()
    first = store.acquire(a)
    assert store.acquire(b) == first, "the second pod reuses the first one's load"
    assert (first.bytes, first.key) == (SIZE, "team-a/fn/resnet")
    assert gpu_memory_used(node.gpu_dir) == SIZE
    importers = [node.importer(), node.importer()]
    for importer in importers:
        assert importer("open", name="w", handle=first.handle)["result"] == SUCCESS
        assert importer.reads("w", node.weights)
    state = read_state(node.gpu_dir)
    assert state.mem_used == SIZE, "counted once, however many processes map it"
    assert sorted(p.mem_used for p in state.procs if p.alive) == [0, 0, SIZE]
    store.sweep()
    assert [m.bytes for m in store.held_models()[GPU]] == [SIZE]
    assert store.model_pods() == {(GPU, "team-a/fn/resnet"): 2}
    socket_mode = (node.workers.socket_path(GPU)).stat().st_mode & 0o777
    assert socket_mode == 0o600
    assert node.workers.socket_dir.stat().st_mode & 0o777 == 0o700


def test_freed_after_the_grace_period_then_the_worker_exits(node: Node) -> None:
    a = model_pod("a")
    node.pods.put(a)
    store = node.store()
    handle = store.acquire(a).handle
    pid = node.worker_pid()
    assert pid is not None
    node.pods.put(attrs.evolve(a, deleting=True))
    store.sweep()
    node.clock.advance(299)
    store.sweep()
    assert gpu_memory_used(node.gpu_dir) == SIZE, "in its grace period: still held"
    node.clock.advance(1)
    store.sweep()
    assert store.held_models() == {}
    assert gpu_memory_used(node.gpu_dir) == 0
    assert node.importer()("open", name="w", handle=handle)["result"] == INVALID_VALUE, "the handle is stale"
    assert wait_until_gone(pid), "a worker holding nothing exits (--idle-exit-seconds)"


def test_a_killed_worker_leaves_mappings_readable_and_the_next_acquire_reloads(node: Node) -> None:
    a = model_pod("a")
    node.pods.put(a)
    store = node.store()
    old = store.acquire(a).handle
    importer = node.importer()
    assert importer("open", name="w", handle=old)["result"] == SUCCESS
    pid = node.worker_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    assert wait_until_gone(pid)
    assert importer.reads("w", node.weights), "the simulated GPU keeps an open mapping's bytes"
    store.sweep()
    assert store.held_models() == {}, "what the dead worker held is no longer published"
    new = store.acquire(a).handle
    assert new != old
    assert node.worker_pid() not in (None, pid), "a new worker"
    late = node.importer()
    assert late("open", name="old", handle=old)["result"] == INVALID_VALUE, "the dead worker's handle is refused"
    assert late("open", name="w", handle=new)["result"] == SUCCESS
    assert late.reads("w", node.weights)
    assert gpu_memory_used(node.gpu_dir) == SIZE


def test_a_restarted_store_adopts_the_running_worker(node: Node) -> None:
    a = model_pod("a")
    node.pods.put(a)
    first = node.store()
    handle = first.acquire(a).handle
    first.stop()  # the agent stops: its worker keeps running
    again = node.store()
    again.start()
    try:
        assert [m.key for m in again.held_models()[GPU]] == ["team-a/fn/resnet"]
        assert again.acquire(a).handle == handle, "not reloaded"
        assert gpu_memory_used(node.gpu_dir) == SIZE
    finally:
        again.stop()


def ask(path: Path, document: dict[str, object]) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(30)
        connection.connect(str(path))
        connection.sendall(json.dumps(document).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = connection.recv(4096)
            if not chunk:
                break
            data += chunk
    assert data.count(b"\n") == 1, "one line"
    answer: dict[str, Any] = json.loads(data)
    return answer


def test_the_model_socket_answers_a_pod_its_own_model_and_refuses_with_one_line(node: Node) -> None:
    own, plain = model_pod("own"), model_pod("plain", spec=None)
    missing = model_pod("missing", spec=ModelSpec(name="bert", bytes=10, path="bert/none.bin"))
    for pod in (own, plain, missing):
        node.pods.put(pod)
    store = node.store()
    path = node.root / "run" / keys.MODEL_SOCKET_NAME
    server = ModelAccessServer(path, node.pods, store, trusted_env=True)
    server.start()
    try:
        assert path.stat().st_mode & 0o777 == 0o666
        answer = ask(path, {"op": "open", "model": "", "pod": own.key})
        assert answer["ok"] is True
        assert (answer["bytes"], answer["model"]) == (SIZE, "team-a/fn/resnet")
        assert protocol.parse_handle(answer["handle"]) == answer["handle"]
        assert ask(path, {"op": "open", "model": "resnet", "pod": own.key})["handle"] == answer["handle"]
        other = ask(path, {"op": "open", "model": "bert", "pod": own.key})
        assert other == {"ok": False, "error": "pod team-a/own may open only its own function's model 'resnet' "
                                               "(annotation fastgshare/model), not 'bert': ask for 'resnet' or "
                                               "for \"\" (the pod's own)"}
        refused = ask(path, {"op": "open", "model": "", "pod": plain.key})
        assert refused["ok"] is False
        assert refused["error"].startswith("pod team-a/plain declares no model: it has no fastgshare/model annotation")
        absent = ask(path, {"op": "open", "pod": missing.key})
        assert str(node.model_dir / "bert" / "none.bin") in absent["error"]
        assert "is missing: put the weights there" in absent["error"]
        assert "allowed" in ask(path, {"op": "close"})["error"]
        assert "not on this node" in ask(path, {"op": "open", "pod": "team-a/nobody"})["error"]
    finally:
        server.stop()


def test_the_model_socket_finds_the_pod_by_the_peers_pid(node: Node) -> None:
    own = model_pod("own")
    node.pods.put(own)
    me = os.getpid()
    path = node.root / "run" / keys.MODEL_SOCKET_NAME
    server = ModelAccessServer(path, node.pods, node.store(), pod_uid=lambda pid: own.uid if pid == me else None,
                               max_connections_per_pod=1)
    server.start()
    try:
        answer = ask(path, {"op": "open", "model": "", "pod": "team-a/someone-else"})  # the claim is ignored
        assert (answer["ok"], answer["model"]) == (True, "team-a/fn/resnet")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as held:  # one connection open, not sending
            held.connect(str(path))
            time.sleep(0.2)  # the server counts it on accept; a refusal cannot come before
            over = ask(path, {"op": "open"})
            assert over["ok"] is False
            assert f"pod {own.uid} already has 1 connections open to the model socket" in over["error"]
    finally:
        server.stop()


def test_two_functions_declaring_the_same_file_get_a_copy_each_never_each_others(node: Node) -> None:
    """A pod never maps another function's weights: the same name, size and file declared by another
    function (as a forged annotation would) is another model, loaded and handed out apart."""
    own, other = model_pod("own"), model_pod("other", function="impostor")
    for pod in (own, other):
        node.pods.put(pod)
    path = node.root / "run" / keys.MODEL_SOCKET_NAME
    server = ModelAccessServer(path, node.pods, node.store(), trusted_env=True)
    server.start()
    try:
        first = ask(path, {"op": "open", "model": "", "pod": own.key})
        second = ask(path, {"op": "open", "model": "", "pod": other.key})
        assert (first["model"], second["model"]) == ("team-a/fn/resnet", "team-a/impostor/resnet")
        assert first["handle"] != second["handle"]
        assert gpu_memory_used(node.gpu_dir) == 2 * SIZE
    finally:
        server.stop()
