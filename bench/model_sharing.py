"""GPU memory of N pods of one function with and without model sharing, on the simulated GPU (prints
one JSON object).

Both cases run N fake-fn processes (``simgpu/workloads/fake_fn.c``) under the C hook on one fresh
simulated GPU, each allocating ``--own-mib`` of its own (``FAKE_FN_MEMORY``: activations, workspace)
and holding a ``--weights-mib`` model (one file of random bytes):

- ``shared``: each maps the model with ``FAKE_FN_MODEL`` through the hook's ``fastgshare_model_open``
  from the node agent's real model store: the pod-facing :class:`~device_plugin.models.access.ModelAccessServer`
  (pods identified by the kernel's peer PID, mapped to the bench's pod records instead of a cgroup)
  in front of a :class:`~device_plugin.models.store.ModelStore`, whose worker process
  (``python -m device_plugin.models.worker``) loads the file once and exports it by CUDA IPC;
  each pod's ``gpu_mem`` is its own memory only.
- ``copies``: each loads the file itself (``FAKE_FN_MODEL_FILE``), its own copy; each pod's
  ``gpu_mem`` is its own memory plus the weights.

Per case, once all N are ready and have answered: the simulated GPU's pool bytes in use (its state
file, :mod:`simgpu.state`), the fake-fns' own bytes summed, the store worker's bytes, and the seconds
from starting the first fake-fn to the last one's ready line (informational: it includes the load).
Every answer's window of the weights (``model.fnv1a64``) is checked against the file:
``answers_correct``. The saving is ``copies`` minus ``shared`` in pool bytes. Every process and
temporary directory is removed at the end, also on failure. Needs make and gcc (the hook and the
simulated GPU are built first, a no-op when up to date); no root, no Kubernetes.

Run: ``python -m bench.model_sharing [--pods 4] [--weights-mib 256] [--own-mib 64]``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any

import attrs

from device_plugin.allocation import NodePod, SimulatedDriver
from device_plugin.models.access import ModelAccessServer
from device_plugin.models.store import ModelStore, ProcessWorkers, WorkerGone, worker_env
from fastgshare import keys
from fastgshare.codec import PodAssignment
from fastgshare.model import ModelSpec, model_annotation
from fastgshare.share import ShareSpec
from fastgshare_cli.sandbox import GPU_UUID, SANDBOX_NAMESPACE, HookBuild, Sandbox, TenantSpec, build_hook, sandbox
from simgpu.fake_fn import fnv1a64, window
from simgpu.state import read_state

MiB = 1 << 20
GPU_POOL_BYTES = 16 << 30  # the simulated GPU's memory (its default)
MODEL_NAME = "weights"
MODEL_PATH = "bench/weights.bin"  # under the store's model directory
FUNCTION = "fn"
NODE = "bench-node"
REQUESTS_PER_POD = 8
READY_TIMEOUT_S = 120.0
REQUEST_TIMEOUT_S = 30.0
PID_WAIT_S = 2.0  # how long the model socket waits for a just-started fake-fn's PID to be registered
LIMITS = {"pods": (1, 64), "weights-mib": (1, 8192), "own-mib": (0, 8192)}


class BenchError(RuntimeError):
    """A case could not run; the message says which process and why."""


# --- the pure parts -------------------------------------------------------------------------------
def _bounded(flag: str) -> Callable[[str], int]:
    low, high = LIMITS[flag]

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"--{flag}: {text!r}; allowed: an integer {low}..{high}")
        return value

    return parse


@attrs.frozen
class Settings:
    pods: int
    weights_bytes: int
    own_bytes: int


def parse_args(argv: Sequence[str] | None) -> Settings:
    """The flags; argparse's exit 2 with one line naming the flag, the value and what is allowed."""
    parser = argparse.ArgumentParser(prog="python -m bench.model_sharing", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--pods", type=_bounded("pods"), default=4, help="N, the pods of the function (default: 4)")
    parser.add_argument("--weights-mib", type=_bounded("weights-mib"), default=256,
                        help="the model's size in MiB (default: 256)")
    parser.add_argument("--own-mib", type=_bounded("own-mib"), default=64,
                        help="each pod's own GPU memory in MiB (default: 64)")
    args = parser.parse_args(argv)
    total_mib = args.pods * (args.weights_mib + args.own_mib)
    if total_mib > GPU_POOL_BYTES // MiB:
        parser.error(f"--pods × (--weights-mib + --own-mib): {total_mib} MiB without sharing; allowed: at most the "
                     f"simulated GPU's {GPU_POOL_BYTES // MiB} MiB")
    return Settings(pods=args.pods, weights_bytes=args.weights_mib * MiB, own_bytes=args.own_mib * MiB)


def expected_model(read: Callable[[int, int], bytes], size: int, seq: int) -> dict[str, Any]:
    """The ``model`` object of answer ``seq`` for weights of ``size`` bytes; ``read(offset, length)``
    gives the file's bytes."""
    offset, length = window(size, seq)
    return {"name": MODEL_NAME, "bytes": size, "offset": offset, "length": length,
            "fnv1a64": fnv1a64(read(offset, length))}


@attrs.frozen
class CaseResult:
    """One case as measured, all bytes from the simulated GPU's state file."""

    pool_used_bytes: int  # the whole pool in use
    pods_own_bytes: int  # the fake-fns' allocations, summed
    store_bytes: int  # the model store worker's (0 without sharing)
    gpu_mem_per_pod_bytes: int  # each pod's declared gpu_mem, what the hook charges it against
    ready_s: float
    answers_checked: int
    answers_correct: bool

    def to_json(self) -> dict[str, Any]:
        return {"pool_used_bytes": self.pool_used_bytes, "pods_own_bytes": self.pods_own_bytes,
                "store_bytes": self.store_bytes, "gpu_mem_per_pod_bytes": self.gpu_mem_per_pod_bytes,
                "ready_s": round(self.ready_s, 2), "answers_checked": self.answers_checked,
                "answers_correct": self.answers_correct}


def result(settings: Settings, shared: CaseResult, copies: CaseResult) -> dict[str, Any]:
    """The printed object: the settings, both cases and the saving in pool bytes."""
    saving = copies.pool_used_bytes - shared.pool_used_bytes
    percent = 100.0 * saving / copies.pool_used_bytes if copies.pool_used_bytes else 0.0
    return {"benchmark": "model_sharing", "pods": settings.pods, "weights_bytes": settings.weights_bytes,
            "own_bytes_per_pod": settings.own_bytes, "requests_per_pod": REQUESTS_PER_POD,
            "gpu_pool_bytes": GPU_POOL_BYTES, "shared": shared.to_json(), "copies": copies.to_json(),
            "saving_bytes": saving, "saving_percent": round(percent, 1),
            "answers_correct": shared.answers_correct and copies.answers_correct}


# --- the processes --------------------------------------------------------------------------------
class PodsByPid:
    """The bench's pod records (the store's pod source) and which fake-fn PID is which pod (the model
    socket's ``pod_uid``, in place of reading the PID's cgroup)."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._pods: list[NodePod] = []
        self._uids: dict[int, str] = {}

    def add(self, pod: NodePod) -> None:
        with self._lock:
            self._pods.append(pod)

    def register(self, pid: int, uid: str) -> None:
        with self._lock:
            self._uids[pid] = uid
            self._lock.notify_all()

    def snapshot(self) -> tuple[int, list[NodePod]]:
        with self._lock:
            return len(self._pods), list(self._pods)

    def uid_of(self, pid: int) -> str | None:
        with self._lock:
            self._lock.wait_for(lambda: pid in self._uids, timeout=PID_WAIT_S)
            return self._uids.get(pid)


def node_pod(spec: TenantSpec, settings: Settings) -> NodePod:
    """The node agent's record of the pod ``spec`` runs as: on the bench's GPU, declaring the model."""
    model = ModelSpec(name=MODEL_NAME, bytes=settings.weights_bytes, path=MODEL_PATH)
    share = ShareSpec(request_permille=int(spec.request * 1000), limit_permille=int(spec.limit * 1000),
                      sm_percent=spec.sm, memory_bytes=settings.own_bytes or MiB)
    assignment = PodAssignment(node_name=NODE, gpu_uuid=GPU_UUID, gpu_index=0, share=share,
                               assigned_at_ms=int(time.time() * 1000))
    return NodePod(uid=f"uid-{spec.name}", namespace=SANDBOX_NAMESPACE, name=spec.name, node_name=NODE,
                   phase="Running", resource_version="1",
                   annotations={keys.MODEL_ANNOTATION: model_annotation(FUNCTION, model)},
                   gpu_containers=("fn",), controller=f"FaSTPod/{FUNCTION}", assignment=assignment)


def write_weights(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as file:
        for start in range(0, size, 16 * MiB):
            file.write(os.urandom(min(16 * MiB, size - start)))


@attrs.define
class Started:
    name: str
    pid: int
    ready: dict[str, Any] | None = None
    ready_at: float = 0.0


def read_ready(box: Sandbox, started: Started) -> None:
    """Reads the fake-fn's ready line (thread body; an exit or a kill ends it with none)."""
    stdout = box.tenants[started.name].stdout
    line = stdout.readline() if stdout is not None else ""
    started.ready_at = time.monotonic()
    with suppress(ValueError):
        document = json.loads(line)
        if isinstance(document, dict) and document.get("event") == "ready":
            started.ready = document


def wait_ready(box: Sandbox, started: list[Started]) -> None:
    threads = [threading.Thread(target=read_ready, args=(box, one), daemon=True) for one in started]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + READY_TIMEOUT_S
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    for one in started:
        if one.ready is None:
            log = box.workdir / f"{one.name}.log"
            lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
            try:
                code: int | None = box.tenants[one.name].wait(timeout=1)  # its exit closed the pipe
            except subprocess.TimeoutExpired:
                code = None
            what = f"exited with status {code} before it was ready" if code is not None else \
                f"not ready within {READY_TIMEOUT_S:g}s"
            raise BenchError(f"fake-fn {one.name} (pid {one.pid}) {what}: "
                             f"{lines[-1] if lines else 'it wrote nothing on stderr'}")


def check_answers(port: int, weights: Path, size: int, count: int) -> bool:
    """``count`` answers of the fake-fn on ``port``, each window hashing like the file's bytes."""
    fd = os.open(weights, os.O_RDONLY)
    try:
        for _ in range(count):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=REQUEST_TIMEOUT_S) as answer:
                body = json.loads(answer.read())
            if body.get("model") != expected_model(lambda offset, length: os.pread(fd, length, offset), size,
                                                   int(body["seq"])):
                return False
    finally:
        os.close(fd)
    return True


def stop_worker(workers: ProcessWorkers) -> None:
    """Kills the store's worker (it outlives the store by design, as it outlives the node agent)."""
    with suppress(WorkerGone, OSError, ValueError):
        pid = workers.call(GPU_UUID, {"op": "list"}, 5.0).get("pid")
        if isinstance(pid, int):
            os.kill(pid, signal.SIGKILL)
    workers.kill_started()  # the one this bench started, if the list failed


def run_case(build: HookBuild, settings: Settings, weights_dir: Path, *, shared: bool) -> CaseResult:
    """One case on a fresh simulated GPU (and arbiter); every process it starts is stopped on return."""
    own_mib = settings.own_bytes // MiB
    gpu_mem_mib = own_mib if shared else own_mib + settings.weights_bytes // MiB
    specs = [TenantSpec(name=f"{FUNCTION}-{i}", request=1.0 / settings.pods, limit=1.0,
                        memory=f"{max(gpu_mem_mib, 1)}Mi") for i in range(settings.pods)]
    weights = weights_dir / MODEL_PATH
    env = {"FAKE_FN_PORT": "0", "FAKE_FN_HOST": "127.0.0.1", "FAKE_FN_GPU_MS": "0", "FAKE_FN_MODEL": MODEL_NAME,
           "FAKE_FN_MEMORY": str(settings.own_bytes), keys.ENV_FAKE_GPU_MEMORY: str(GPU_POOL_BYTES)}
    with sandbox(build, specs) as box, ExitStack() as cleanup:  # cleanup first, then the sandbox
        pods = PodsByPid()
        workers: ProcessWorkers | None = None
        if shared:
            driver = SimulatedDriver(libcuda=str(build.fake_driver_dir / keys.CUDA_DRIVER_LIBRARY),
                                     libnvidia_ml=str(build.fake_driver_dir / keys.NVML_LIBRARY),
                                     gpu_dirs={GPU_UUID: str(box.gpu_dir)}, gpu_memory={GPU_UUID: GPU_POOL_BYTES})
            workers = ProcessWorkers(box.workdir / "models",
                                     {GPU_UUID: worker_env(GPU_UUID, driver, build.fake_driver_dir)})
            cleanup.callback(stop_worker, workers)
            store = ModelStore(node_name=NODE, model_dir=weights_dir, gpus=(GPU_UUID,), pods=pods, workers=workers)
            store.start()
            cleanup.callback(store.stop)
            server = ModelAccessServer(box.workdir / "run" / keys.MODEL_SOCKET_NAME, pods, store,
                                       pod_uid=pods.uid_of, max_connections_per_pod=2)
            server.start()
            cleanup.callback(server.stop)
            env[keys.ENV_MODEL_SOCKET] = str(server.socket_path)
        else:
            env["FAKE_FN_MODEL_FILE"] = str(weights)
        for spec in specs:
            pods.add(node_pod(spec, settings))
        started = []
        began = time.monotonic()
        for spec in specs:
            process = box.start_process(spec, [str(build.fake_fn)], env=env,
                                        stderr_log=box.workdir / f"{spec.name}.log")
            pods.register(process.pid, f"uid-{spec.name}")
            started.append(Started(spec.name, process.pid))
        wait_ready(box, started)
        ready_s = max(one.ready_at for one in started) - began
        correct = all((one.ready or {}).get("model") == {"name": MODEL_NAME, "bytes": settings.weights_bytes,
                                                         "shared": shared} for one in started)
        for one in started:
            correct = check_answers(int((one.ready or {})["port"]), weights, settings.weights_bytes,
                                    REQUESTS_PER_POD) and correct
        state = read_state(box.gpu_dir)
        own = sum(state.by_pid(one.pid).mem_used for one in started)
        store_bytes = 0
        if workers is not None:
            pid = workers.call(GPU_UUID, {"op": "list"}, 5.0).get("pid")
            store_bytes = state.by_pid(pid).mem_used if isinstance(pid, int) else 0
        return CaseResult(pool_used_bytes=state.mem_used, pods_own_bytes=own, store_bytes=store_bytes,
                          gpu_mem_per_pod_bytes=gpu_mem_mib * MiB, ready_s=ready_s,
                          answers_checked=settings.pods * REQUESTS_PER_POD, answers_correct=correct)


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_args(argv)
    try:
        build = build_hook()
        with tempfile.TemporaryDirectory(prefix="fgs-bench-model-") as directory:
            weights_dir = Path(directory)
            write_weights(weights_dir / MODEL_PATH, settings.weights_bytes)
            shared = run_case(build, settings, weights_dir, shared=True)
            copies = run_case(build, settings, weights_dir, shared=False)
    except Exception as error:  # one line, whatever failed; the cases have cleaned up
        print(json.dumps({"benchmark": "model_sharing", "error": f"{type(error).__name__}: {error}"}))
        return 1
    print(json.dumps(result(settings, shared, copies), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
