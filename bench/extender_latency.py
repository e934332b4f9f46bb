"""Extender filter and prioritize latency over real HTTP (prints one JSON object).

For 100, 1,000 and 5,000 nodes of 8 GPUs (V100, 16 GiB, MPS), every GPU half full (two pods of
0.5 of the time x 50 % SM and 4 GiB each), the extender's cache is fed directly, through the
same calls its watch makes; no API server is needed. The app runs on the production HTTP
server on loopback in a process of its own, as in a cluster: a client in the extender's process
would share its interpreter lock, and every ~100th answer would wait up to Python's 5 ms switch
interval for the client thread (measured: p99 7.4 ms in-process against 1.3 ms, 100 nodes). The
bench's process is the client: it sends the requests a node-cache-capable kube-scheduler sends
(``NodeNames`` with every node) on one kept-alive connection, and tells the extender's process
over a pipe when to feed its cache (one more pod, a relist).

Pods ask for one of four shares, as the replicas of a few FaSTPods would. The extender
remembers its answers per share and node state, so the figures are given for:

- ``warm``: a share seen before on an unchanged cache;
- ``steady``: the same, but before each pod one more resident pod lands on a node (a bind
  elsewhere, so every request sees a new cache generation, and a node in a state never seen);
- ``cold``: the first request of each share after start, every node judged anew;
- ``after_rebuild``: the first filter and prioritize after the pods are relisted (the cache
  rebuilt: every node entry new), for a share asked before the relist (``seen``) and for a
  share never asked (``new``).

Run: ``python -m bench.extender_latency [--sizes 100,1000,5000] [--requests N]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import statistics
import struct
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from bench.c_programs import ROOT, compile_program
from fastgshare import keys
from fastgshare.assignment_signature import AssignmentTrust
from fastgshare.codec import PodAssignment, encode_assignment, encode_node_inventory
from fastgshare.inventory import GpuDevice, NodeInventory
from fastgshare.share import ShareSpec, share_annotations
from scheduler_extender.config import ExtenderConfig
from scheduler_extender.http.apps import create_app
from scheduler_extender.http.threaded import ThreadedHttpServer
from scheduler_extender.records import NodeRecord, PodRecord
from scheduler_extender.services import build_services
from scheduler_extender.state import ClusterState

GiB = 2**30
GPUS_PER_NODE = 8
RESIDENT = ShareSpec(request_permille=500, limit_permille=500, sm_percent=50, memory_bytes=4 * GiB)
ASKED = (  # what the measured pods ask for; each fits a half-full GPU
    ShareSpec(request_permille=200, limit_permille=400, sm_percent=40, memory_bytes=2 * GiB),
    ShareSpec(request_permille=300, limit_permille=300, sm_percent=30, memory_bytes=1 * GiB),
    ShareSpec(request_permille=100, limit_permille=500, sm_percent=20, memory_bytes=1 * GiB),
    ShareSpec(request_permille=250, limit_permille=500, sm_percent=50, memory_bytes=2 * GiB),
)


COMMAND_TIMEOUT_S = 300  # building 5,000 nodes' cache takes ~10 s; a relist about as long
REQUESTS = 1_000  # per verb and kind: a p99 of 100 samples would be the slowest one alone
NEW_SHARE = ShareSpec(request_permille=150, limit_permille=300, sm_percent=30, memory_bytes=1 * GiB)
EXTRA = ShareSpec(request_permille=100, limit_permille=100, sm_percent=10, memory_bytes=1 * GiB)  # steady churn


TRUST = AssignmentTrust(b"bench-assignment-key-0123456789abcdef")  # the bench's own key


def half_full_cluster_and_pods(nodes: int) -> tuple[ClusterState, list[PodRecord]]:
    """``nodes`` nodes of 8 GPUs, each GPU holding two resident pods (half its area and memory), and
    those pods (to relist them)."""
    state = ClusterState(bind_wait_s=0, trust=TRUST)
    names = [f"node-{i:05d}" for i in range(nodes)]
    records = []
    pods = []
    for name in names:
        gpus = tuple(GpuDevice(uuid=f"GPU-{name}-{g}", index=g, model="Tesla V100", memory_bytes=16 * GiB,
                               sm_count=80, mps_enabled=True) for g in range(GPUS_PER_NODE))
        records.append(NodeRecord(name=name, inventory_text=encode_node_inventory(
            NodeInventory(node_name=name, gpus=gpus, slots_per_gpu=keys.DEFAULT_SLOTS_PER_GPU))))
        for gpu in gpus:
            for slot in range(2):
                assigned = PodAssignment(node_name=name, gpu_uuid=gpu.uuid, gpu_index=gpu.index, share=RESIDENT,
                                         assigned_at_ms=1 + slot)
                pods.append(PodRecord(uid=f"{gpu.uuid}-{slot}", namespace="resident", name=f"{gpu.uuid}-{slot}",
                                      node_name=name, phase="Running",
                                      annotations={**_signed(f"{gpu.uuid}-{slot}", assigned),
                                                   keys.POD_ALLOCATED_ANNOTATION: "yes"}))
    state.replace_nodes(records)
    state.replace_pods(pods, state.begin_relist())
    return state, pods


def extra_pod(nodes: int, serial: int) -> PodRecord:
    """One more resident pod (a bind that changes one node): on every node's GPU 0 in turn, then on
    their GPU 1, and so on, so no GPU gets more than its room."""
    name = f"node-{serial % nodes:05d}"
    gpu = serial // nodes % GPUS_PER_NODE
    uuid = f"GPU-{name}-{gpu}"
    assigned = PodAssignment(node_name=name, gpu_uuid=uuid, gpu_index=gpu, share=EXTRA, assigned_at_ms=10 + serial)
    return PodRecord(uid=f"extra-{serial}", namespace="resident", name=f"extra-{serial}", node_name=name,
                     phase="Running", annotations={**_signed(f"extra-{serial}", assigned),
                                                   keys.POD_ALLOCATED_ANNOTATION: "yes"})


def _signed(uid: str, assigned: PodAssignment) -> dict[str, str]:
    """The assignment and its signature, as the extender writes them (the cache verifies each)."""
    return {keys.POD_ASSIGNMENT_ANNOTATION: encode_assignment(assigned),
            keys.POD_ASSIGNMENT_SIGNATURE_ANNOTATION: TRUST.sign(uid, assigned) or ""}


def request_body(names: list[str], share: ShareSpec, serial: int) -> bytes:
    pod = {"metadata": {"name": f"bench-{serial}", "namespace": "bench", "uid": f"uid-{serial}",
                        "annotations": share_annotations(share)},
           "spec": {"schedulerName": keys.SCHEDULER_NAME,
                    "containers": [{"name": "main", "resources": {"limits": {keys.VGPU_RESOURCE: "1"}}}]},
           "status": {"phase": "Pending"}}
    return json.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}).encode()


class HttpTimer:
    """``bench/http_timer.c`` on one kept-alive connection to the extender: :meth:`post` returns
    how long a request took, from its send to the last byte of the answer, timed in C."""

    def __init__(self, port: int) -> None:
        self._build = tempfile.TemporaryDirectory(prefix="fgs-bench-http-")
        binary = compile_program(Path(self._build.name) / "http_timer", ROOT / "bench" / "http_timer.c")
        self._process = subprocess.Popen([str(binary), "127.0.0.1", str(port)], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE)

    def post(self, verb: str, body: bytes) -> float:
        request = (f"POST /{verb} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        stdin, stdout = self._process.stdin, self._process.stdout
        assert stdin is not None
        assert stdout is not None
        stdin.write(struct.pack("<I", len(request)) + request)
        stdin.flush()
        answer = stdout.read(12)
        if len(answer) != 12:
            raise RuntimeError(f"http_timer exited (code {self._process.wait(5)}) during {verb}; its error is above")
        elapsed_ns, status = struct.unpack("<QI", answer)
        if status != 200:
            (length,) = struct.unpack("<I", stdout.read(4))
            raise RuntimeError(f"{verb} answered {status}: {stdout.read(length)!r}")
        return elapsed_ns / 1e9

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        self._process.wait(10)
        if self._process.stdout is not None:
            self._process.stdout.close()
        self._build.cleanup()


def summary(seconds: list[float]) -> dict[str, float | int]:
    ordered = sorted(seconds)
    return {"n": len(ordered), "p50_ms": round(statistics.median(ordered) * 1000, 3),
            "p99_ms": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1000, 3),
            "max_ms": round(ordered[-1] * 1000, 3)}


def measure(nodes: int, requests: int) -> dict[str, object]:
    names = [f"node-{i:05d}" for i in range(nodes)]
    times: dict[str, list[float]] = {f"{verb}_{kind}": [] for verb in ("filter", "prioritize")
                                     for kind in ("warm", "cold", "steady")}
    rebuild: dict[str, object] = {}
    serial = 0
    extender = ExtenderProcess(nodes)
    try:
        timer = HttpTimer(extender.port)
        for serial in range(len(ASKED) + requests):
            share = ASKED[serial % len(ASKED)]
            body = request_body(names, share, serial)
            kind = "cold" if serial < len(ASKED) else "warm"
            for verb in ("filter", "prioritize"):
                times[f"{verb}_{kind}"].append(timer.post(verb, body))
        for _step in range(requests):
            serial += 1
            extender.add_extra_pod(serial)  # each pod finds the cache changed
            body = request_body(names, ASKED[serial % len(ASKED)], serial)
            for verb in ("filter", "prioritize"):
                times[f"{verb}_steady"].append(timer.post(verb, body))
        for label, share in (("seen", ASKED[0]), ("new", NEW_SHARE)):
            relist_s = extender.relist()
            serial += 1
            body = request_body(names, share, serial)
            first = {verb: round(timer.post(verb, body) * 1000, 3) for verb in ("filter", "prioritize")}
            rebuild[label] = {"relist_s": round(relist_s, 2), "filter_ms": first["filter"],
                              "prioritize_ms": first["prioritize"]}
        timer.close()
    finally:
        extender.stop()
    return {"nodes": nodes, "gpus": nodes * GPUS_PER_NODE, "request_bytes": len(request_body(names, ASKED[0], 0)),
            "cache_build_s": round(extender.build_s, 2),
            **{kind: {verb: summary(times[f"{verb}_{kind}"]) for verb in ("filter", "prioritize")}
               for kind in ("warm", "steady", "cold")},
            "after_rebuild": rebuild}


class ExtenderProcess:
    """The extender's app and cache (:func:`half_full_cluster_and_pods`) served from a process of its
    own (spawned: no state of the bench's is inherited); its cache is fed on command."""

    def __init__(self, nodes: int) -> None:
        context = multiprocessing.get_context("spawn")
        self._pipe, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(nodes, child), name="extender", daemon=True)
        self._process.start()
        child.close()
        self.port, self.build_s = self._ask(None)

    def add_extra_pod(self, serial: int) -> None:
        """:func:`extra_pod` into the cache, as its watch would add it."""
        self._ask(("extra", serial))

    def relist(self) -> float:
        """Relist every resident pod (the cache rebuilt); returns the seconds it took."""
        return float(self._ask(("relist",)))

    def stop(self) -> None:
        if self._process.is_alive():
            with contextlib.suppress(OSError, EOFError):
                self._pipe.send(("stop",))
            self._process.join(timeout=10)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._pipe.close()

    def _ask(self, command: tuple[object, ...] | None) -> Any:
        if command is not None:
            self._pipe.send(command)
        if not self._pipe.poll(COMMAND_TIMEOUT_S):
            raise RuntimeError(f"the extender's process did not answer {command or 'ready'} within "
                               f"{COMMAND_TIMEOUT_S:.0f}s")
        try:
            return self._pipe.recv()
        except EOFError:
            self._process.join(timeout=5)
            raise RuntimeError(f"the extender's process exited (code {self._process.exitcode}) before it answered "
                               f"{command or 'ready'}; its error is above") from None


def _serve(nodes: int, pipe: Connection) -> None:
    """The extender's process: build the cache, serve, and apply the bench's commands until told to stop."""
    started = time.perf_counter()
    state, pods = half_full_cluster_and_pods(nodes)
    build_s = time.perf_counter() - started
    services = build_services(ExtenderConfig(bind_wait_s=0, max_body_bytes=64 * 2**20), state, _NoApi())
    server = ThreadedHttpServer(create_app(services), "127.0.0.1", 0)
    server.start()
    pipe.send((server.port, build_s))
    try:
        while True:
            command = pipe.recv()
            if command[0] == "extra":
                state.upsert_pod(extra_pod(nodes, command[1]))
                pipe.send(None)
            elif command[0] == "relist":
                started = time.perf_counter()
                state.replace_pods(pods, state.begin_relist())
                pipe.send(time.perf_counter() - started)
            else:
                return
    finally:
        server.stop()


class _NoApi:
    """Filter and prioritize never call the API server; bind is not measured here."""

    def read_pod(self, namespace: str, name: str) -> PodRecord | None:
        raise NotImplementedError

    def patch_pod_annotation(self, pod: PodRecord, key: str, value: str | None) -> PodRecord:
        raise NotImplementedError

    def patch_pod_annotations(self, pod: PodRecord, annotations: Mapping[str, str | None]) -> PodRecord:
        raise NotImplementedError

    def create_binding(self, pod: PodRecord, node: str, annotations: Mapping[str, str] | None = None) -> None:
        raise NotImplementedError


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1000,5000", help="node counts (default: %(default)s)")
    parser.add_argument("--requests", type=int, default=REQUESTS,
                        help="warm and steady requests per verb and size (default: %(default)s, enough that the "
                             "p99 is not the single slowest request)")
    args = parser.parse_args(argv)
    if args.requests < 1:
        parser.error(f"--requests must be at least 1, got {args.requests}")
    results = []
    for nodes in (int(size) for size in args.sizes.split(",")):
        results.append(measure(nodes, args.requests))
    print(json.dumps({"benchmark": "extender_latency", "gpus_per_node": GPUS_PER_NODE,
                      "fill": "every GPU half full (area and memory)",
                      "transport": "HTTP/1.1 keep-alive on loopback, NodeNames payloads",
                      "results": results}, indent=2))


if __name__ == "__main__":
    main()
