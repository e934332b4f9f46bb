"""Running the extender for benchmarks and tests: in a thread, as a process, and a stand-in node agent.
(The tests use it through ``tests/integration/scheduler_extender/harness.py``, which adds their
assignment key.)

- :func:`serving` serves an app on a free loopback port in this process (the production
  :class:`~scheduler_extender.http.threaded.ThreadedHttpServer`, the scheduler's listener);
- :class:`ExtenderProcess` runs ``python -m scheduler_extender`` (the real command) and can
  kill and restart it on the same port;
- :class:`AllocationMarker` does what the node agents would after kubelet's Allocate: it marks
  every pod that is bound and carries an assignment as allocated. No kubelet runs in the
  cluster tier, so without it binds to a node would wait ``--bind-wait-seconds`` for their
  turn once ``--bind-window`` of its pods wait for an agent (the marker's writes also load the
  API server as real agents' do);
- :func:`scheduler_config` loads the shipped v1beta1 scheduler configuration and points it
  at a running extender.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import flask
import kubernetes.client
import yaml
from kubernetes.watch.watch import iter_resp_lines

from fastgshare import keys
from fastgshare_kube import rest
from fastgshare_kube.errors import ApiError
from scheduler_extender.config import DEFAULT_BIND_WAIT_S
from scheduler_extender.http.threaded import ThreadedHttpServer

REPO = Path(__file__).resolve().parents[1]
V1BETA1_CONFIG = REPO / "deploy" / "scheduler" / "kube-scheduler-config.v1beta1.yaml"


@contextlib.contextmanager
def serving(app: flask.Flask) -> Iterator[str]:
    """The app on 127.0.0.1 (a free port); yields its base URL."""
    server = ThreadedHttpServer(app, "127.0.0.1", 0)
    server.start()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        server.stop()


def get_json(url: str, timeout_s: float = 10) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return json.load(response)


def is_ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def raw_core_api(api_client: kubernetes.client.ApiClient) -> Any:
    """A CoreV1Api used with raw JSON bodies and ``_preload_content=False`` answers, so untyped."""
    return kubernetes.client.CoreV1Api(api_client)


def scheduler_config(extender_url: str, **extender: object) -> dict[str, Any]:
    """The shipped v1beta1 configuration with its extender at ``extender_url`` (plus overrides)."""
    document: dict[str, Any] = yaml.safe_load(V1BETA1_CONFIG.read_text())
    document["extenders"][0].update({"urlPrefix": extender_url, **extender})
    return document


class ExtenderProcess:
    """``python -m scheduler_extender`` against a kubeconfig, on a fixed loopback port."""

    def __init__(self, kubeconfig: Path, port: int, log_path: Path, *, bind_wait_s: float = DEFAULT_BIND_WAIT_S,
                 policy: str = "binpack", extra_args: Sequence[str] = (), assignment_key: bytes | None = None) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        # The assignment key (a fresh random one unless given), next to the log, unless the caller
        # names a key file or runs unsigned.
        self.key_file = log_path.parent / "assignment-key"
        key_args: list[str] = []
        if not any(arg.startswith(("--assignment-key-file", "--allow-unsigned-assignments")) for arg in extra_args):
            self.key_file.write_bytes(assignment_key if assignment_key is not None else secrets.token_hex(32).encode())
            key_args = ["--assignment-key-file", str(self.key_file)]
        self._args = [sys.executable, "-m", "scheduler_extender", "--kubeconfig", str(kubeconfig),
                      "--listen", f"127.0.0.1:{port}", "--bind-wait-seconds", str(bind_wait_s),
                      "--policy", policy, "--log-level", "info", *key_args, *extra_args]
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60) -> None:
        """Start and wait until ``/readyz`` answers 200 (its cache has synced)."""
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(self._args, stdin=subprocess.DEVNULL, stdout=log,
                                             stderr=subprocess.STDOUT, cwd=REPO)
        deadline = time.monotonic() + timeout_s
        while not is_ready(self.url):
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"extender did not become ready; log {self.log_path}:\n{self.log_tail()}")
            time.sleep(0.1)

    @property
    def pid(self) -> int:
        """The running extender's process id."""
        if self._process is None:
            raise RuntimeError("the extender is not running")
        return self._process.pid

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        """Send ``sig`` (SIGKILL for a crash) and wait; the exit status."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return process.returncode if process else None
        process.send_signal(sig)
        try:
            return process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            return process.wait()

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


class AllocationMarker:
    """A stand-in for the node agents: marks bound, assigned pods allocated, as Allocate would.

    As on real nodes, the pods of one node are marked one at a time and in the order they were
    bound, while different nodes are marked in parallel (``lanes`` nodes at a time, each node
    always in the same lane): a single marking thread for all nodes would be a bottleneck no
    cluster has, and would bound a benchmark of the extender's binds.
    """

    def __init__(self, api_client: kubernetes.client.ApiClient, namespace: str | None = None, *,
                 lanes: int = 16, assignment: str = keys.POD_ASSIGNMENT_ANNOTATION) -> None:
        self._api = api_client
        self._assignment = assignment  # the annotation that says a pod's GPU was chosen
        self._core = raw_core_api(api_client)
        self._namespace = namespace
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="allocation-marker", daemon=True)
        self._lanes = [ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"marker-{n}") for n in range(lanes)]
        self._marking: set[str] = set()  # pod uids with a mark queued or in flight
        self._lock = threading.Lock()
        self.marked = 0

    def __enter__(self) -> AllocationMarker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for lane in self._lanes:
            lane.shutdown(wait=True, cancel_futures=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._watch()
            except Exception:  # a dropped watch is simply resumed
                self._stop.wait(0.2)

    def _watch(self) -> None:
        lister = (self._core.list_pod_for_all_namespaces if self._namespace is None else
                  lambda **kw: self._core.list_namespaced_pod(self._namespace, **kw))
        listing = json.loads(lister(_preload_content=False).data)
        for pod in listing["items"]:
            self._maybe_mark(pod)
        response = lister(watch=True, resource_version=listing["metadata"]["resourceVersion"], timeout_seconds=5,
                          _preload_content=False)
        try:
            for line in iter_resp_lines(response):
                event = rest.decode_json(line)
                if event["type"] in ("ADDED", "MODIFIED"):
                    self._maybe_mark(event["object"])
                if self._stop.is_set():
                    return
        finally:
            response.release_conn()

    def _maybe_mark(self, pod: dict[str, Any]) -> None:
        metadata = pod["metadata"]
        annotations = metadata.get("annotations") or {}
        node = pod["spec"].get("nodeName")
        if (not node or self._assignment not in annotations
                or keys.POD_ALLOCATED_ANNOTATION in annotations):
            return
        with self._lock:
            if metadata["uid"] in self._marking:
                return
            self._marking.add(metadata["uid"])
        lane = self._lanes[zlib.crc32(node.encode()) % len(self._lanes)]
        with contextlib.suppress(RuntimeError):  # shutting down
            lane.submit(self._mark, metadata)

    def _mark(self, metadata: dict[str, Any]) -> None:
        body = {"metadata": {"resourceVersion": metadata["resourceVersion"],
                             "annotations": {keys.POD_ALLOCATED_ANNOTATION: "simulated"}}}
        try:
            with contextlib.suppress(ApiError):  # 409: a newer version will come by the watch
                # the node agent's own write: one merge patch through rest.send (device_plugin/kube.py)
                rest.send(self._api, "PATCH", rest.namespaced_path("v1", metadata["namespace"], "pods",
                                                                   metadata["name"]), body,
                          content_type=rest.MERGE_PATCH)
                with self._lock:
                    self.marked += 1
        finally:
            with self._lock:
                self._marking.discard(metadata["uid"])
