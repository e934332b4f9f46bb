"""Part f, model sharing (issue 40) on the GPU: what 4 pods of one function hold with the weights
shared through the node's model store, against a copy each, including every process's context;
whether every pod reads the file's bytes; and what a stale handle does.

- The node agent's real model-store worker (``python -m device_plugin.models.worker``: standard
  library, attrs and the project only) loads a weights file of known random bytes (256 MiB; 64 MiB
  in the dry run) and exports it, spoken to with the agent -> worker protocol
  (:mod:`device_plugin.models.protocol`). Its environment is the GPU's (:meth:`Gpu.env`: nothing on
  the real GPU, the simulated driver in the dry run). It stays in the part's process group (the node
  agent starts it in a session of its own), so that run.py's stop at the timeout ends it too.
- :class:`PodSocket`: the pod-facing model socket, reduced to the part's one model: the pod -> agent
  protocol, each ``open`` answered by asking the worker to load (idempotent, as the agent does).
- 4 pods' processes under the hook (``programs/model_pod.py open``, the arbiter of
  :func:`bench.gpu.target.arbiter`), each mapping the weights with the hook's
  ``fastgshare_model_open``, reading windows back and reporting ``cuMemGetInfo`` (the pod's view)
  before and after; then 4 with a copy each (``model_pod.py copy``: ``cuMemAlloc`` + HtoD).
- The GPU's used memory from an observer outside the hook (``model_pod.py observe``: NVML, which
  needs no context; ``cuMemGetInfo`` in a context of its own where NVML cannot answer): before
  anything, with the worker alone, with the 4 importers mapped, after all is gone, with 4 copies.
- A stale handle: the worker frees the model and loads another file of the same size, then a pod is
  answered the old handle. The simulated GPU refuses it; a real GPU may map whatever lies at that
  address now (simgpu/README.md, "IPC memory"): recorded, not a failure.

Checked here, asserted by the dry-run test: every window each pod read matches the file; an import
leaves the pod's ``cuMemGetInfo`` unchanged (the hook charges nothing); a copy is charged.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import attrs

from bench.gpu.part import OK, JsonDict, PartContext, PartFailed, Progress, last_json_line
from bench.gpu.target import Gpu, Tenant, arbiter, first_line, fresh_gpu, python_path, stop
from device_plugin.models import protocol
from device_plugin.models.worker import read_line
from fastgshare import keys
from fastgshare.model import ModelRef, ModelSpec

MIB = 1 << 20
PODS = 4
WEIGHTS_MIB, DRY_RUN_WEIGHTS_MIB = 256, 64
WINDOW_ARGS = ["--windows", "16", "--window-bytes", str(64 << 10)]  # spread from the first byte to the last
POD_NAMES = tuple(f"pod{index}" for index in range(PODS))
START_S = 60.0  # a process's first line: Python, the hook, a context, the open or the copy
STALE_S = 20.0  # the stale handle's pod: recorded as "no answer" after this
WORKER_CALL_S = 60.0  # a load reads and copies the whole file
SETTLE_S = 10.0  # memory of processes that exited, back to the driver
SETTLE_SLACK = 32 * MIB
MAX_POD_REQUESTS = 64  # the part's pod socket answers no more than this
MODEL_TIMEOUT_MS = "20000"  # the hook's wait for the pod socket (a loaded CI machine is slow to start 4 at once)
PROGRAM = Path(__file__).resolve().parent / "programs" / "model_pod.py"


# --- the weights --------------------------------------------------------------------------------
def write_weights(path: Path, size: int, seed: int) -> None:
    """``size`` random bytes from ``seed``, 8 MiB at a time (each chunk its own generator)."""
    with path.open("wb") as file:
        for index, start in enumerate(range(0, size, 8 * MIB)):
            file.write(random.Random(seed * 100_003 + index).randbytes(min(8 * MIB, size - start)))


def digest(path: Path, offset: int, length: int) -> str:
    with path.open("rb") as file:
        file.seek(offset)
        return hashlib.sha256(file.read(length)).hexdigest()


def windows_match(windows: list[JsonDict], path: Path) -> bool:
    return bool(windows) and all(w.get("sha256") == digest(path, int(w["offset"]), int(w["length"])) for w in windows)


# --- the worker ----------------------------------------------------------------------------------
def ask_worker(path: Path, document: Mapping[str, object]) -> Mapping[str, object]:
    """One request to the worker (agent -> worker protocol), its answer line."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(WORKER_CALL_S)
        connection.connect(str(path))
        connection.sendall(protocol.encode_line(document))
        return protocol.decode_line(read_line(connection, protocol.LIST_LINE_LIMIT), protocol.LIST_LINE_LIMIT)


@contextlib.contextmanager
def worker(ctx: PartContext, gpu: Gpu, directory: Path) -> Iterator[Path]:
    """The model-store worker on ``gpu``, serving ``directory/w.sock``; stopped on the way out."""
    path, log_path = directory / "w.sock", directory / "worker.log"
    env = {**gpu.env(), "PYTHONPATH": python_path(ctx.repo)}
    with log_path.open("wb") as log:
        process = subprocess.Popen([ctx.python, "-m", "device_plugin.models.worker", "--socket", str(path),
                                    "--idle-exit-seconds", "600"], stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT, env=env, cwd=ctx.repo)
    try:
        deadline = time.monotonic() + START_S
        while True:
            if process.poll() is not None:
                raise PartFailed(f"the model worker exited ({process.returncode}): {tail(log_path)}")
            with contextlib.suppress(OSError, protocol.ProtocolError):
                protocol.parse_list_answer(ask_worker(path, {"op": "list"}))
                break
            if time.monotonic() > deadline:
                raise PartFailed(f"the model worker did not answer within {START_S:.0f} s: {tail(log_path)}")
            time.sleep(0.1)
        yield path
    finally:
        stop(process)


def load(worker_path: Path, model: ModelRef, path: Path) -> str:
    request = protocol.LoadRequest(identity=model.identity, key=model.key, bytes=model.bytes, path=str(path))
    try:
        return protocol.parse_load_answer(ask_worker(worker_path, protocol.load_request(request)), model.bytes)
    except protocol.AnswerRefused as refused:
        raise PartFailed(f"the model worker refused to load {model.key}: {refused}") from None


def free(worker_path: Path, model: ModelRef) -> None:
    protocol.parse_answer(ask_worker(worker_path, {"op": "free", "identity": model.identity}))


# --- the pod-facing socket -----------------------------------------------------------------------
class PodSocket:
    """The node agent's ``model.sock`` reduced to one model, on a thread: each pod -> agent ``open``
    is answered with the worker's handle for ``model`` (a ``load``, idempotent), or with ``stale``
    where set. One connection at a time, 5 s to read a request of at most 4096 bytes, at most
    :data:`MAX_POD_REQUESTS` answered."""

    def __init__(self, path: Path, worker_path: Path, model: ModelRef, weights: Path) -> None:
        self.path, self.worker_path, self.model, self.weights = path, worker_path, model, weights
        self.stale: str | None = None
        self.requests: list[JsonDict] = []
        self.refusals: list[str] = []
        self._stop = threading.Event()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        self._listener.listen(16)
        self._listener.settimeout(0.2)
        self._thread = threading.Thread(target=self._serve, name="pod-socket", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with connection:
                connection.settimeout(protocol.TIMEOUT_S)
                with contextlib.suppress(OSError):
                    connection.sendall(protocol.encode_line(self._answer(connection)))

    def _answer(self, connection: socket.socket) -> Mapping[str, object]:
        if len(self.requests) >= MAX_POD_REQUESTS:
            return self._refuse(f"the part's model socket answers at most {MAX_POD_REQUESTS} requests")
        try:
            document = protocol.decode_line(read_line(connection))
            request = protocol.parse_open_request(document)
        except (protocol.ProtocolError, OSError) as error:
            return self._refuse(str(error))
        self.requests.append(dict(document))
        if request.model not in ("", self.model.spec.name):
            return self._refuse(f"model {request.model!r}: this pod's model is {self.model.spec.name!r}")
        try:
            handle = self.stale or load(self.worker_path, self.model, self.weights)
        except (PartFailed, OSError, protocol.ProtocolError) as error:
            return self._refuse(str(error))
        return protocol.open_answer(handle, self.model.bytes, self.model.key)

    def _refuse(self, message: str) -> Mapping[str, object]:
        self.refusals.append(message)
        return protocol.error(message)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._listener.close()
        self.path.unlink(missing_ok=True)


# --- processes -----------------------------------------------------------------------------------
def tail(path: Path, limit: int = 400) -> str:
    try:
        return " / ".join(path.read_text(errors="replace").strip().splitlines()[-3:])[-limit:]
    except OSError:
        return ""


class Processes:
    """The part's programs (``model_pod.py``), each with stdin and stdout piped and stderr in a log;
    all stopped by :meth:`close`."""

    def __init__(self, ctx: PartContext, directory: Path) -> None:
        self.ctx, self.directory = ctx, directory
        self.started: list[tuple[str, subprocess.Popen[str]]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
        with (self.directory / f"{name}.err").open("w") as err:
            process = subprocess.Popen([self.ctx.python, str(PROGRAM), *argv], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=err, text=True, env=env, cwd=self.ctx.repo)
        self.started.append((name, process))
        return process

    def result(self, name: str, process: subprocess.Popen[str], *, errors_ok: bool = False,
               timeout_s: float = START_S) -> JsonDict:
        """The program's next line as JSON (PartFailed, with its stderr, when there is none or it
        reports an error and ``errors_ok`` is false)."""
        found = last_json_line(first_line(process, timeout_s))
        if found is None or ("error" in found and not errors_ok):
            why = (found or {}).get("error") or f"no result within {timeout_s:.0f} s (exit {process.poll()})"
            raise PartFailed(f"{name}: {why}: {tail(self.directory / f'{name}.err')}")
        return found

    @staticmethod
    def release(process: subprocess.Popen[str]) -> JsonDict:
        """Let a holding program release what it holds and exit; its last line."""
        try:
            stdout, _ = process.communicate("release\n", timeout=30)
        except subprocess.TimeoutExpired:
            stop(process)
            return {"error": "did not exit within 30 s of release"}
        return last_json_line(stdout) or {"exit": process.returncode}

    def close(self) -> None:
        for _, process in self.started:
            stop(process)


class Observer:
    """``model_pod.py observe``: the GPU's used memory, read on demand."""

    def __init__(self, processes: Processes, gpu: Gpu) -> None:
        self.process = processes.start("observer", ["observe"], gpu.env())
        self.processes = processes
        self.first = processes.result("observer", self.process)

    def read(self) -> JsonDict:
        assert self.process.stdin is not None
        self.process.stdin.write("\n")
        self.process.stdin.flush()
        return self.processes.result("observer", self.process)

    def settle(self, floor: int) -> JsonDict:
        """A reading once the GPU's used memory is back within SETTLE_SLACK of ``floor`` (or after SETTLE_S)."""
        deadline = time.monotonic() + SETTLE_S
        reading = self.read()
        while int(reading["used"]) > floor + SETTLE_SLACK and time.monotonic() < deadline:
            time.sleep(0.2)
            reading = self.read()
        return reading


# --- the part ------------------------------------------------------------------------------------
def pod_outcome(name: str, found: JsonDict, path: Path) -> JsonDict:
    before, after = found["meminfo_before"], found["meminfo_after"]
    return {"pod": name, "pid": found["pid"], "ptr": found["ptr"], "bytes": found["bytes"], "ms": found["ms"],
            "pod_view_free_before": before["free"], "pod_view_free_after": after["free"],
            "pod_view_total": after["total"], "pod_charged_bytes": int(before["free"]) - int(after["free"]),
            "windows": len(found["windows"]), "read_the_file": windows_match(found["windows"], path)}


def run_pods(processes: Processes, mode: str, argv: list[str], envs: dict[str, dict[str, str]],
             path: Path) -> tuple[list[subprocess.Popen[str]], list[JsonDict]]:
    """Start one program per pod at once; their outcomes once all have reported (they keep holding)."""
    started = {name: processes.start(f"{mode}-{name}", [mode, *argv, *WINDOW_ARGS], env) for name, env in envs.items()}
    outcomes = [pod_outcome(name, processes.result(f"{mode}-{name}", process), path)
                for name, process in started.items()]
    return list(started.values()), outcomes


def stale_outcome(found: JsonDict, freed: Path, loaded_since: Path) -> JsonDict:
    if "error" in found:
        return {"outcome": "refused", "code": found.get("code"), "error": found["error"]}
    windows = found["windows"]
    if windows_match(windows, loaded_since):
        outcome = "mapped the bytes loaded since (another model's)"
    elif windows_match(windows, freed):
        outcome = "mapped the freed model's bytes"
    else:
        outcome = "mapped other bytes"
    return {"outcome": outcome, "ptr": found["ptr"], "bytes": found["bytes"]}


def difference(after: JsonDict, before: JsonDict) -> int:
    return int(after["used"]) - int(before["used"])


def model_sharing(ctx: PartContext, progress: Progress) -> JsonDict:
    ctx.build.need("hook")
    size = (DRY_RUN_WEIGHTS_MIB if ctx.dry_run else WEIGHTS_MIB) * MIB
    directory = ctx.scratch("ms")
    weights, other = directory / "weights.bin", directory / "other.bin"
    write_weights(weights, size, seed=40)
    write_weights(other, size, seed=41)
    progress.put("weights_bytes", size)
    progress.put("pods", PODS)
    gpu = fresh_gpu(ctx, "model-sharing")
    tenants = [Tenant(name=name, request=round(1 / (PODS + 1), 3), limit=1.0) for name in [*POD_NAMES, "stale"]]
    used: JsonDict = {}
    with contextlib.ExitStack() as stack:
        processes = Processes(ctx, directory)
        stack.callback(processes.close)
        observer = Observer(processes, gpu)
        used["baseline"] = observer.first
        progress.put("used_by", observer.first["by"])
        arbiter_socket = stack.enter_context(arbiter(ctx, "model-sharing", tenants))
        run = Run(ctx, progress, gpu, str(ctx.build.hook), arbiter_socket, processes, observer, used)
        imported = run.shared(directory, weights, other, size)
        used["after_worker_stopped"] = observer.settle(int(used["baseline"]["used"]))
        copied = run.copies(weights)
    progress.put("gpu_used_bytes", {step: int(reading["used"]) for step, reading in used.items()})
    return {"status": OK, **progress.data, **summary(used, imported, copied, size, gpu)}


@attrs.define
class Run:
    """The part's two measurements, on one GPU, one arbiter and one observer."""

    ctx: PartContext
    progress: Progress
    gpu: Gpu
    hook: str
    arbiter_socket: Path
    processes: Processes
    observer: Observer
    used: JsonDict

    def env(self, pod: str, model_socket: Path | None = None) -> dict[str, str]:
        env = self.gpu.hooked_env(self.hook, self.arbiter_socket, f"gpu/{pod}")
        if model_socket is not None:
            env.update({keys.ENV_MODEL_SOCKET: str(model_socket), "FASTGSHARE_MODEL_TIMEOUT_MS": MODEL_TIMEOUT_MS})
        return env

    def shared(self, directory: Path, weights: Path, other: Path, size: int) -> list[JsonDict]:
        """The worker alone, then with 4 importers; then the stale handle. The worker is gone after."""
        model = ModelRef(namespace="gpu", function="fn", spec=ModelSpec(name="weights", bytes=size, path=weights.name))
        other_model = ModelRef(namespace="gpu", function="other", spec=ModelSpec(name="other", bytes=size,
                                                                                   path=other.name))
        with contextlib.ExitStack() as stack:
            worker_path = stack.enter_context(worker(self.ctx, self.gpu, directory))
            handle = load(worker_path, model, weights)
            pid, held = protocol.parse_list_answer(ask_worker(worker_path, {"op": "list"}))
            self.progress.put("worker", {"pid": pid, "holds": [{"key": m.key, "bytes": m.bytes} for m in held]})
            self.used["worker_alone"] = self.observer.read()
            pod_socket = PodSocket(directory / "m.sock", worker_path, model, weights)
            stack.callback(pod_socket.close)
            envs = {name: self.env(name, pod_socket.path) for name in POD_NAMES}
            importers, imported = run_pods(self.processes, "open", [], envs, weights)
            self.used[f"worker_and_{PODS}_importers"] = self.observer.read()
            self.progress.put("importers", imported)
            self.progress.put("importers_released", [Processes.release(process) for process in importers])

            free(worker_path, model)  # the worker forgets the handle, then cuMemFree
            load(worker_path, other_model, other)  # something new, on a real GPU likely at the same address
            pod_socket.stale = handle
            stale = self.processes.start("stale", ["open", "--no-hold", *WINDOW_ARGS],
                                         self.env("stale", pod_socket.path))
            try:  # recorded whatever it does: a real GPU may map the new bytes (simgpu/README.md, "IPC memory")
                outcome = stale_outcome(self.processes.result("stale", stale, errors_ok=True, timeout_s=STALE_S),
                                        weights, other)
            except PartFailed as error:
                outcome = {"outcome": "no answer", "error": str(error)}
            finally:
                stop(stale)
            self.progress.put("stale_handle", outcome)
            free(worker_path, other_model)
            self.progress.put("pod_socket", {"requests": len(pod_socket.requests), "refusals": pod_socket.refusals})
        return imported

    def copies(self, weights: Path) -> list[JsonDict]:
        """4 pods with a copy each of the weights (cuMemAlloc + HtoD), no worker."""
        envs = {name: self.env(name) for name in POD_NAMES}
        copiers, copied = run_pods(self.processes, "copy", ["--file", str(weights)], envs, weights)
        self.used[f"{PODS}_own_copies"] = self.observer.read()
        self.progress.put("copies", copied)
        self.progress.put("copies_released", [Processes.release(process) for process in copiers])
        return copied


def summary(used: JsonDict, imported: list[JsonDict], copied: list[JsonDict], size: int, gpu: Gpu) -> JsonDict:
    with_sharing = difference(used[f"worker_and_{PODS}_importers"], used["baseline"])
    without = difference(used[f"{PODS}_own_copies"], used["after_worker_stopped"])
    result: JsonDict = {
        "worker_alone_bytes": difference(used["worker_alone"], used["baseline"]),
        "held_with_sharing_bytes": with_sharing,
        "held_without_sharing_bytes": without,
        "saved_bytes": without - with_sharing,
        "per_importer_bytes": difference(used[f"worker_and_{PODS}_importers"], used["worker_alone"]) // PODS,
        "per_copy_bytes": without // PODS,
        "verdicts": {
            "every_importer_read_the_file": all(pod["read_the_file"] for pod in imported),
            "every_copy_read_the_file": all(pod["read_the_file"] for pod in copied),
            "import_charged_nothing_to_the_pod": all(pod["pod_charged_bytes"] == 0 for pod in imported),
            "copy_charged_to_the_pod": all(pod["pod_charged_bytes"] >= size for pod in copied),
        },
    }
    if gpu.simulated:
        result["note"] = ("the simulated GPU models no context memory: the figures are the weights alone, not a "
                          "GPU's")
    return result
