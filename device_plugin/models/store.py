"""The node agent's side of the model store: which models each GPU holds, the worker processes
that hold them, and handing a pod its model's handle.

- Needs (:mod:`.plan`): from the agent's pod records, which models each GPU needs.
- Workers: one per GPU (:mod:`.worker`), started on first need in a session of its own
  (``start_new_session``) with the GPU's environment (:func:`worker_env`), serving
  ``<socket dir>/<gpu uuid>.sock``. A restarted agent finds a running worker by its socket and
  adopts what its ``list`` says it holds; a worker that no longer answers (crashed, or exited idle)
  is replaced by a new one on the next need. The agent stopping leaves the workers running, by
  design: the pods' mappings stay valid across an agent restart (docs/node-agent.md "Model store").
- :meth:`ModelStore.acquire`: a pod's own model on its assigned GPU, loaded or reused; every
  refusal is :class:`ModelUnavailable` with one line saying what is wrong and how to fix it.
- Freeing: a held model no pod needs is freed after the grace period (``--model-grace-seconds``;
  the clock is injectable for tests), by a sweep that runs every second.
- :meth:`ModelStore.held_models`: per GPU, what the store holds (also in its grace period), for the
  inventory (``GpuDevice.held_models``) and the metrics.
- What it holds, on disk (:class:`HeldFile`, ``<socket dir>/held.json``, rewritten atomically on
  every change), so that a restarted agent whose workers died with it (the agent's container
  restarted) knows what was lost.
- Losses: a worker found gone (while the agent runs, or at start where ``held.json`` says it held
  models) lost its models. On a real GPU the pods that mapped them must be restarted; with a
  ``warn`` callback (the agent passes one on real GPUs only) each live pod on that GPU that declares
  a lost model gets one Warning (reason ``ModelLost``) once the pod records are synced, once per
  pod and model. The agent deletes no pod (docs/security.md).

Locks: one per GPU around every worker call (loads, frees and the decision to free are serialized,
so a model is never freed between a pod's acquire and its answer), and one for the tables.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

import attrs

from device_plugin.allocation import NodePod, SimulatedDriver
from device_plugin.models import protocol
from device_plugin.models.held_file import HeldFile, SavedModel
from device_plugin.models.plan import Need, Retention, Slot, assigned_gpu, models_needed, needed_slots
from device_plugin.models.worker import CUDA_LIBRARY, read_line
from fastgshare import keys
from fastgshare.model import HeldModel, InvalidModelSpec, ModelRef, parse_model_annotation

log = logging.getLogger(__name__)

DEFAULT_GRACE_S = 300.0
DEFAULT_IDLE_EXIT_S = 30.0
SWEEP_S = 1.0
START_TIMEOUT_S = 15.0
CALL_TIMEOUT_S = 5.0
LOAD_BYTES_PER_S = 100e6  # the slowest disk a load is given time for, on top of CALL_TIMEOUT_S
REASON_MODEL_LOST = "ModelLost"

Warn = Callable[[NodePod, str, str], None]  # (pod, reason, message): a Warning Event on the pod


class ModelUnavailable(Exception):
    """The pod cannot have its model now; the message is one line saying why and how to fix it."""


class WorkerGone(Exception):
    """No worker answers on the GPU's socket (never started, exited idle, or crashed)."""


class PodSource(Protocol):
    def snapshot(self) -> tuple[int, list[NodePod]]: ...


@attrs.frozen
class Acquired:
    """A pod's model as the pod is told it."""

    handle: str
    bytes: int
    key: str


@attrs.define
class _Held:
    model: HeldModel
    handle: str


@attrs.define
class _Loss:
    model: HeldModel
    why: str
    fresh: set[str] = attrs.field(factory=set)  # pods that were handed a new copy since: not affected


def worker_env(gpu_uuid: str, driver: SimulatedDriver | None, driver_lib_dir: Path | None,
               base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of GPU ``gpu_uuid``'s worker: on a simulated GPU the simulated driver (found by
    the loader through ``driver_lib_dir``, which holds ``libcuda.so.1``) and the GPU's state, as a
    GPU container gets them; on a real GPU that one GPU (``CUDA_VISIBLE_DEVICES``)."""
    env = {name: value for name, value in (os.environ if base is None else base).items()
           if name not in ("LD_PRELOAD", "CUDA_VISIBLE_DEVICES", keys.ENV_FAKE_GPU_DIR, keys.ENV_FAKE_GPU_MEMORY)}
    if driver is not None and gpu_uuid in driver.gpu_dirs and driver_lib_dir is not None:
        env["LD_LIBRARY_PATH"] = ":".join(p for p in (str(driver_lib_dir), env.get("LD_LIBRARY_PATH", "")) if p)
        env[keys.ENV_FAKE_GPU_DIR] = driver.gpu_dirs[gpu_uuid]
        env[keys.ENV_FAKE_GPU_MEMORY] = str(driver.gpu_memory[gpu_uuid])
    else:
        env["CUDA_VISIBLE_DEVICES"] = gpu_uuid
    return env


def simulated_driver_dir(driver: SimulatedDriver, directory: Path) -> Path:
    """A directory holding ``libcuda.so.1``, a link to the installed simulated driver (whose file name
    carries its digest), for the workers' loader to find."""
    directory.mkdir(parents=True, exist_ok=True)
    link = directory / CUDA_LIBRARY
    if not (link.is_symlink() and os.readlink(link) == driver.libcuda):
        temporary = directory / f".{CUDA_LIBRARY}.{os.getpid()}"
        temporary.unlink(missing_ok=True)
        temporary.symlink_to(driver.libcuda)
        os.replace(temporary, link)
    return directory


class Workers(Protocol):
    """The per-GPU worker processes, by GPU uuid."""

    def call(self, gpu: str, request: Mapping[str, object], timeout_s: float) -> dict[str, object]:
        """One request and its answer; :class:`WorkerGone` if no worker answers on the socket."""
        ...

    def start(self, gpu: str) -> None:
        """Make sure a worker serves ``gpu`` (start one if none answers); :class:`ModelUnavailable` if
        none can."""
        ...

    def reap(self) -> None:
        """Collect workers that have exited (no zombies)."""
        ...


class ProcessWorkers:
    """Worker processes on unix sockets ``<socket_dir>/<gpu uuid>.sock``."""

    def __init__(self, socket_dir: Path, envs: Mapping[str, Mapping[str, str]], *,
                 idle_exit_s: float = DEFAULT_IDLE_EXIT_S, python: str = sys.executable,
                 start_timeout_s: float = START_TIMEOUT_S) -> None:
        self.socket_dir = socket_dir
        self._envs = dict(envs)
        self._idle_exit_s = idle_exit_s
        self._python = python
        self._start_timeout_s = start_timeout_s
        self._children: list[subprocess.Popen[bytes]] = []

    def socket_path(self, gpu: str) -> Path:
        return self.socket_dir / f"{gpu}.sock"

    def log_path(self, gpu: str) -> Path:
        return self.socket_dir / f"{gpu}.log"

    def call(self, gpu: str, request: Mapping[str, object], timeout_s: float) -> dict[str, object]:
        path = self.socket_path(gpu)
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with connection:
            connection.settimeout(CALL_TIMEOUT_S)
            try:
                connection.connect(str(path))
            except (FileNotFoundError, ConnectionRefusedError) as error:
                raise WorkerGone(f"no model worker answers at {path} ({error.strerror})") from None
            try:
                connection.sendall(protocol.encode_line(request))
                connection.settimeout(timeout_s)
                raw = read_line(connection, protocol.LIST_LINE_LIMIT)
            except (BrokenPipeError, ConnectionResetError) as error:
                raise WorkerGone(f"the model worker at {path} closed the connection ({error.strerror})") from None
            except protocol.ProtocolError as error:
                if "closed before" in str(error):
                    raise WorkerGone(f"the model worker at {path} closed the connection without an answer") from None
                raise
        return protocol.decode_line(raw, protocol.LIST_LINE_LIMIT)

    def start(self, gpu: str) -> None:
        if gpu not in self._envs:
            raise ModelUnavailable(f"GPU {gpu} is not one of this node's GPUs")
        self.reap()
        try:
            self.call(gpu, {"op": "list"}, CALL_TIMEOUT_S)
            return
        except (WorkerGone, OSError, protocol.ProtocolError):
            pass
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        self.socket_dir.chmod(0o700)  # the sockets are the agent's alone
        command = [self._python, "-m", "device_plugin.models.worker", "--socket", str(self.socket_path(gpu)),
                   "--idle-exit-seconds", f"{self._idle_exit_s:g}"]
        with open(self.log_path(gpu), "ab") as output:
            child = subprocess.Popen(command, env=dict(self._envs[gpu]), stdin=subprocess.DEVNULL, stdout=output,
                                     stderr=output, start_new_session=True, close_fds=True, cwd="/")
        self._children.append(child)
        log.info("started model worker gpu=%s pid=%d socket=%s log=%s", gpu, child.pid, self.socket_path(gpu),
                 self.log_path(gpu))
        deadline = time.monotonic() + self._start_timeout_s
        while time.monotonic() < deadline:
            try:
                self.call(gpu, {"op": "list"}, CALL_TIMEOUT_S)
                return
            except (WorkerGone, OSError, protocol.ProtocolError):
                pass
            if child.poll() is not None:
                raise ModelUnavailable(f"the model worker for GPU {gpu} exited with status {child.returncode}: "
                                       f"{_last_line(self.log_path(gpu))} (its log: {self.log_path(gpu)})")
            time.sleep(0.05)
        raise ModelUnavailable(f"the model worker for GPU {gpu} did not answer within {self._start_timeout_s:g}s "
                               f"(its log: {self.log_path(gpu)})")

    def reap(self) -> None:
        """Collect the exit status of workers this agent started that have exited (no zombies)."""
        self._children = [child for child in self._children if child.poll() is None]

    def kill_started(self) -> None:
        """SIGKILL the workers this object started and wait for them: for tests and benches only (the
        agent never stops its workers: they outlive it by design)."""
        for child in self._children:
            if child.poll() is None:
                child.kill()
            child.wait(timeout=30)
        self._children = []


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no log"
    return lines[-1] if lines else "it wrote nothing"


class ModelStore:
    """What each GPU holds, loading and freeing through the workers (thread-safe)."""

    def __init__(self, *, node_name: str, model_dir: Path, gpus: tuple[str, ...], pods: PodSource, workers: Workers,
                 grace_s: float = DEFAULT_GRACE_S, clock: Callable[[], float] = time.monotonic,
                 synced: Callable[[], bool] = lambda: True, sweep_s: float = SWEEP_S,
                 held_file: Path | None = None, warn: Warn | None = None) -> None:
        """``held_file``: where to keep what the store holds (``<socket dir>/held.json``; None: nowhere).
        ``warn``: tell a pod that its model was lost (real GPUs); None: tell nobody (simulated GPUs,
        where the pods' mappings outlive the worker)."""
        self.node_name = node_name
        self.model_dir = model_dir
        self._gpus = tuple(gpus)
        self._pods = pods
        self._workers = workers
        self._clock = clock
        self._synced = synced
        self._sweep_s = sweep_s
        self._retention = Retention(grace_s)
        self._lock = threading.Lock()
        self._gpu_locks = {gpu: threading.Lock() for gpu in self._gpus}
        self._held: dict[Slot, _Held] = {}
        self._needs: dict[str, dict[str, Need]] = {}
        self._revision = 0
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._file = HeldFile(held_file) if held_file is not None else None
        self._saved: tuple[list[SavedModel], list[SavedModel]] | None = None
        self._save_lock = threading.Lock()
        self._warn = warn
        self._lost: dict[Slot, _Loss] = {}  # lost, pods not told yet
        self._told: set[tuple[str, str]] = set()  # (pod uid, model identity) warned already

    # --- life ------------------------------------------------------------------------------------
    def start(self) -> None:
        """Adopt the workers already running (a restarted agent); a GPU whose worker is gone but
        which ``held.json`` says held models lost them. Then sweep in the background."""
        held, lost = self._file.load() if self._file is not None else ([], [])
        for saved in lost:
            if saved.gpu in self._gpu_locks:
                self._lose(saved.gpu, saved.model, saved.why)
        for gpu in self._gpus:
            if self._adopt(gpu):
                continue
            for saved in held:
                if saved.gpu == gpu:
                    log.error("model=%s gpu=%s lost: its worker exited while no node agent ran (with the agent's "
                              "container, or it crashed)", saved.model.key, gpu)
                    self._lose(gpu, saved.model, "its worker exited while no node agent ran: with the agent's "
                                                 "container, or it crashed")
        self._persist()
        self._thread = threading.Thread(target=self._sweep_loop, name="model-store", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop sweeping. The workers keep running, holding what they hold: a restarted agent adopts
        them, and the pods' mappings stay valid meanwhile."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    # --- what the agent publishes ---------------------------------------------------------------
    def revision(self) -> int:
        """A number that changes whenever what the GPUs hold does."""
        with self._lock:
            return self._revision

    def held_models(self) -> dict[str, tuple[HeldModel, ...]]:
        """GPU uuid -> the models its worker holds (in the grace period too), sorted by identity."""
        with self._lock:
            found: dict[str, list[HeldModel]] = {}
            for (gpu, _identity), held in sorted(self._held.items()):
                found.setdefault(gpu, []).append(held.model)
        return {gpu: tuple(models) for gpu, models in found.items()}

    def model_pods(self) -> dict[tuple[str, str], int]:
        """(GPU uuid, model key) -> the live pods on that GPU that declare it, for every held or needed model."""
        with self._lock:
            counts = {(gpu, held.model.key): 0 for (gpu, _), held in self._held.items()}
            for gpu, models in self._needs.items():
                for need in models.values():
                    key = (gpu, need.model.key)
                    counts[key] = counts.get(key, 0) + len(need.pods)
        return counts

    # --- pods ------------------------------------------------------------------------------------
    def model_of(self, pod: NodePod) -> ModelRef:
        """The model ``pod`` declares; :class:`ModelUnavailable` with one line if none or malformed."""
        text = pod.annotations.get(keys.MODEL_ANNOTATION)
        if text is None:
            raise ModelUnavailable(f"pod {pod.key} declares no model: it has no {keys.MODEL_ANNOTATION} annotation "
                                   "(the function controller writes it on the pods of a FaSTFunc with spec.model; "
                                   "give the function a spec.model)")
        try:
            return parse_model_annotation(text, pod.namespace)
        except InvalidModelSpec as error:
            raise ModelUnavailable(f"pod {pod.key}: {error}") from None

    def model_file(self, model: ModelRef) -> Path:
        """The model's file on this node; :class:`ModelUnavailable` naming the path if it is not there as declared."""
        path = self.model_dir / model.spec.path
        where = (f"on node {self.node_name} (the node agent's --model-dir {self.model_dir} joined with "
                 f"spec.model.source.path {model.spec.path})")
        try:
            info = path.stat()
        except OSError as error:
            what = "is missing" if error.errno == errno.ENOENT else f"cannot be read ({error.strerror})"
            raise ModelUnavailable(f"model {model.key}: its file {path} {what}: put the weights there {where}") \
                from None
        if not stat.S_ISREG(info.st_mode):
            raise ModelUnavailable(f"model {model.key}: {path} is not a regular file: the weights must be one file "
                                   f"{where}")
        if info.st_size != model.bytes:
            raise ModelUnavailable(f"model {model.key}: its file {path} has {info.st_size} bytes but spec.model.bytes "
                                   f"says {model.bytes}: make them agree")
        return path

    def acquire(self, pod: NodePod) -> Acquired:
        """``pod``'s own model on its assigned GPU, loaded if the GPU does not hold it yet."""
        model = self.model_of(pod)
        gpu = assigned_gpu(pod, self.node_name)
        if gpu is None:
            if pod.deleting or pod.phase in ("Succeeded", "Failed"):
                raise ModelUnavailable(f"pod {pod.key} is finished or being deleted: it gets no model")
            raise ModelUnavailable(f"pod {pod.key} is not assigned to a GPU of node {self.node_name} yet (no "
                                   f"{keys.POD_ASSIGNMENT_ANNOTATION} the node agent trusts"
                                   + (f": {pod.assignment_problem}" if pod.assignment_problem else "")
                                   + "): open the model once the pod runs on its GPU")
        if gpu not in self._gpu_locks:
            raise ModelUnavailable(f"pod {pod.key} is assigned GPU {gpu}, which is not one of node "
                                   f"{self.node_name}'s GPUs")
        path = self.model_file(model)
        slot = (gpu, model.identity)
        with self._gpu_locks[gpu]:
            handle = self._load(gpu, model, path)
            with self._lock:
                self._retention.touch(slot)
                known = self._held.get(slot)
                if known is None or known.handle != handle:
                    self._held[slot] = _Held(HeldModel(identity=model.identity, key=model.key, bytes=model.bytes),
                                             handle)
                    self._revision += 1
                if (loss := self._lost.get(slot)) is not None:
                    loss.fresh.add(pod.uid)  # it maps the new copy
            self._persist()
        return Acquired(handle=handle, bytes=model.bytes, key=model.key)

    def _load(self, gpu: str, model: ModelRef, path: Path) -> str:
        request = protocol.LoadRequest(identity=model.identity, key=model.key, bytes=model.bytes, path=str(path))
        timeout_s = CALL_TIMEOUT_S + model.bytes / LOAD_BYTES_PER_S
        for attempt in (1, 2):
            try:
                answer = self._workers.call(gpu, protocol.load_request(request), timeout_s)
                return protocol.parse_load_answer(answer, model.bytes)
            except WorkerGone:
                if attempt == 2:
                    raise ModelUnavailable(f"the model worker for GPU {gpu} went away while loading {model.key}; "
                                           "ask again") from None
                self._forget_gpu(gpu, "its worker does not answer")
                self._workers.start(gpu)
            except protocol.AnswerRefused as refused:
                raise ModelUnavailable(str(refused)) from None
            except (protocol.ProtocolError, OSError) as error:
                raise ModelUnavailable(f"the model worker for GPU {gpu} did not answer the load of {model.key} "
                                       f"properly: {error}") from None
        raise AssertionError("unreachable")

    # --- freeing and following the workers -------------------------------------------------------
    def sweep(self) -> None:
        """One pass: free what is due (unneeded for the grace period), and drop what a worker no
        longer holds (it exited or crashed)."""
        if not self._synced():
            return  # an agent that has not listed its pods would take every model for unneeded
        pods = self._pods.snapshot()[1]
        needs = models_needed(pods, self.node_name)
        with self._lock:
            self._needs = needs
            due = self._retention.due(self._held, needed_slots(needs), self._clock())
        for slot in due:
            self._free(slot)
        for gpu in self._gpus:
            self._follow(gpu)
        self._workers.reap()
        self._tell_losses(pods)

    def _tell_losses(self, pods: list[NodePod]) -> None:
        """Warn each live pod on a GPU that lost its model (once per pod and model); the losses are
        then done with."""
        with self._lock:
            lost, self._lost = self._lost, {}
            live = {pod.uid for pod in pods}
            self._told = {told for told in self._told if told[0] in live}
        if not lost:
            return
        needs = models_needed(pods, self.node_name)
        by_uid = {pod.uid: pod for pod in pods}
        for (gpu, identity), loss in sorted(lost.items()):
            need = needs.get(gpu, {}).get(identity)
            uids = sorted(need.pods - loss.fresh) if need is not None else []
            told = []
            for uid in uids:
                with self._lock:
                    if (uid, identity) in self._told:
                        continue
                    self._told.add((uid, identity))
                pod = by_uid[uid]
                try:
                    self._say_lost(pod, gpu, loss)
                except Exception:  # one failed Event must not keep the others from going out
                    log.exception("pod=%s could not be told that model %s was lost", pod.key, loss.model.key)
                told.append(pod.key)
            log.warning("model=%s gpu=%s lost: told %d pods (Event %s): %s", loss.model.key, gpu, len(told),
                        REASON_MODEL_LOST, ",".join(told) or "-")
        self._persist()

    def _say_lost(self, pod: NodePod, gpu: str, loss: _Loss) -> None:
        assert self._warn is not None
        self._warn(pod, REASON_MODEL_LOST,
                   f"the model store of node {self.node_name} lost model {loss.model.key} on GPU {gpu} ({loss.why}); "
                   "this pod's mapping of the weights is no longer valid: delete the pod, its FaSTPod makes a new "
                   "one that maps a fresh copy")

    def _lose(self, gpu: str, model: HeldModel, why: str) -> None:
        """Remember that ``gpu`` lost ``model``, for the pods to be told (only with a ``warn``)."""
        if self._warn is None:
            return
        with self._lock:
            self._lost[(gpu, model.identity)] = _Loss(model, why)

    def _free(self, slot: Slot) -> None:
        gpu, identity = slot
        with self._gpu_locks[gpu]:
            # Again under the GPU's lock: a pod may have come (or asked) since the decision.
            if slot in needed_slots(models_needed(self._pods.snapshot()[1], self.node_name)):
                return
            with self._lock:
                held = self._held.get(slot)
                since = self._retention.unneeded_since(slot)
                if held is None or since is None or self._clock() - since < self._retention.grace_s:
                    return
            try:
                protocol.parse_answer(self._workers.call(gpu, {"op": "free", "identity": identity}, CALL_TIMEOUT_S))
            except WorkerGone:
                pass  # nothing to free: it is gone
            except (protocol.AnswerRefused, protocol.ProtocolError, OSError) as error:
                log.error("model=%s gpu=%s could not be freed: %s", held.model.key, gpu, error)
                return
            with self._lock:
                self._held.pop(slot, None)
                self._retention.forget(slot)
                self._revision += 1
            self._persist()
            log.info("model=%s gpu=%s freed bytes=%d: no pod needed it for %gs", held.model.key, gpu,
                     held.model.bytes, self._retention.grace_s)

    def _follow(self, gpu: str) -> None:
        """What GPU ``gpu``'s worker holds, as it says; nothing if it does not answer (skipped while
        another call to it is under way)."""
        with self._lock:
            holds = any(slot[0] == gpu for slot in self._held)
        if not holds:
            return
        lock = self._gpu_locks[gpu]
        if not lock.acquire(blocking=False):
            return
        try:
            try:
                _pid, models = protocol.parse_list_answer(self._workers.call(gpu, {"op": "list"}, CALL_TIMEOUT_S))
            except WorkerGone:
                self._forget_gpu(gpu, "its worker is gone (crashed or killed)")
                return
            except (protocol.AnswerRefused, protocol.ProtocolError, OSError) as error:
                log.warning("gpu=%s the model worker's list failed: %s", gpu, error)
                return
            self._replace(gpu, models)
        finally:
            lock.release()

    def _adopt(self, gpu: str) -> bool:
        """Take on what GPU ``gpu``'s running worker holds; False if no worker is there (a worker that
        answers badly is not taken for gone)."""
        try:
            pid, models = protocol.parse_list_answer(self._workers.call(gpu, {"op": "list"}, CALL_TIMEOUT_S))
        except WorkerGone:
            return False
        except (protocol.AnswerRefused, protocol.ProtocolError, OSError) as error:
            log.warning("gpu=%s the model worker's list failed at start: %s", gpu, error)
            return True
        self._replace(gpu, models)
        log.info("adopted model worker gpu=%s pid=%d models=%s", gpu, pid, ",".join(m.key for m in models) or "-")
        return True

    def _replace(self, gpu: str, models: tuple[protocol.WorkerModel, ...]) -> None:
        wanted = {(gpu, m.identity): _Held(HeldModel(identity=m.identity, key=m.key, bytes=m.bytes), m.handle)
                  for m in models}
        with self._lock:
            current = {slot: held for slot, held in self._held.items() if slot[0] == gpu}
            if current == wanted:
                return
            for slot in current:
                del self._held[slot]
            self._held.update(wanted)
            self._revision += 1
        self._persist()

    def _forget_gpu(self, gpu: str, why: str) -> None:
        with self._lock:
            lost = [self._held.pop(slot).model for slot in list(self._held) if slot[0] == gpu]
            for model in lost:
                self._retention.forget((gpu, model.identity))
                log.error("model=%s gpu=%s lost: %s; pods that mapped it keep their mapping on a simulated GPU, on a "
                          "real GPU they must be restarted%s (docs/node-agent.md, Model store)", model.key, gpu, why,
                          ": they are told (Event ModelLost)" if self._warn is not None else "")
            if lost:
                self._revision += 1
        for model in lost:
            self._lose(gpu, model, why)
        self._persist()

    def _persist(self) -> None:
        """Write ``held.json`` if what it would say changed (a failed write is logged: the store goes
        on serving)."""
        if self._file is None:
            return
        with self._save_lock:  # snapshot and write in one: the last write carries the latest state
            with self._lock:
                content = ([SavedModel(gpu, held.model) for (gpu, _), held in sorted(self._held.items())],
                           [SavedModel(gpu, loss.model, loss.why) for (gpu, _), loss in sorted(self._lost.items())])
            if content == self._saved:
                return
            try:
                self._file.save(*content)
            except OSError as error:
                log.error("model store file %s could not be written (%s): a restarted agent may not know what its "
                          "workers held", self._file.path, error.strerror or error)
                return
            self._saved = content

    def _sweep_loop(self) -> None:
        while not self._stopping.wait(self._sweep_s):
            try:
                self.sweep()
            except Exception:  # a bug must not end the sweeping for good
                log.exception("model store sweep failed")
