"""What one ``fastgshare run`` got from its GPU: measured apart from the hook and the arbiter where
the GPU allows (the simulated GPU), and as the arbiter counted it (both GPUs).

A run's processes are CMD and every process that carries the run's ``FASTGSHARE_POD`` in its
environment or descends from CMD (so a program's workers count, and another run's processes
on the same GPU do not). The meter is sampled every ~0.1 s, and once more when CMD has exited
(before it is reaped): CMD itself always counts, however short it ran; a descendant that is born,
uses the GPU and exits between two samples is not counted.

- Simulated GPU: the GPU's own state file (:mod:`simgpu.state`). Each process slot records its
  kernels, its busy time (the run time of its kernels) and the memory it holds; a slot's holder is
  mapped to a pid in this PID namespace by :func:`simgpu.state.slot_holders`. The run's GPU time
  is the sum over its slots, which outlive their processes, so a worker that exited still counts.
  Peak memory is the largest sum of the run's slots' memory seen in one sample.
- Real GPU: the arbiter's memory ledger of the run's pod (:class:`LedgerMeter`: what the hook
  reserved for allocations, the number the limit is enforced on; the CUDA context is not in it),
  and the GPU time the hook reported to the arbiter (below, :func:`with_arbiter_time`): NVML
  measures no GPU time per process. Kernels stay unknown (None): the hook reports no launch counts.
- Both: the arbiter's usage file (:class:`ArbiterUsageMeter`; its format is
  :mod:`device_plugin.arbiter.standalone`'s): the run's pod's GPU time as its hooks reported it per
  token, the tokens granted, how long its token requests waited and the part of that wait it was at
  its own limit (throttled). Counted from the run's first sample, across arbiter generations (an
  arbiter started again counts from zero in a file of its own); the last reading comes after CMD
  exited, from a write asked for then (SIGUSR1).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

import attrs

from fastgshare import keys, protocol
from simgpu.state import ProcRecord, sample_state, slot_holders

MAX_ANCESTRY = 64  # a process deeper than this below CMD is taken for not descending from it
FINAL_USAGE_TIMEOUT_S = 2.0  # how long the last reading waits for the arbiter's fresh usage file


@attrs.frozen
class RunTotals:
    """The run's numbers so far: GPU time (ns) and kernels (None where the GPU does not say), memory now and at peak."""

    busy_ns: int | None
    kernels: int | None
    memory_bytes: int
    peak_memory_bytes: int


class RunProcesses:
    """Which processes (pids in this PID namespace) are the run's."""

    def __init__(self, root_pid: int, pod: str, proc: Path = Path("/proc")) -> None:
        self.root, self._proc = root_pid, proc
        self._parents: dict[int, int] = {}  # pid -> its parent, as of the last listing
        self._marker = f"{keys.ENV_POD}={pod}".encode()

    def __call__(self, pid: int) -> bool:
        """Whether the live process ``pid`` is CMD, carries the run's pod or descends from CMD."""
        if pid <= 0:
            return False
        return pid == self.root or self._has_marker(pid) or self._descends(pid)

    def tree(self) -> set[int]:
        """CMD and its descendants alive now: a listing of ``/proc``, and the parent of each pid not
        seen in the last listing (parents of known pids are kept, so a sample stays cheap)."""
        listing = {int(name) for name in os.listdir(self._proc) if name.isdigit()}
        for gone in self._parents.keys() - listing:
            del self._parents[gone]
        for new in listing - self._parents.keys():
            self._parents[new] = self._parent(new)
        children: dict[int, list[int]] = {}
        for pid, parent in self._parents.items():
            children.setdefault(parent, []).append(pid)
        found, todo = {self.root}, [self.root]
        while todo:
            for child in children.get(todo.pop(), []):
                if child not in found:
                    found.add(child)
                    todo.append(child)
        return found

    def _has_marker(self, pid: int) -> bool:
        try:
            return self._marker in (self._proc / str(pid) / "environ").read_bytes().split(b"\0")
        except OSError:  # gone, or not ours to read
            return False

    def _descends(self, pid: int) -> bool:
        for _ in range(MAX_ANCESTRY):
            pid = self._parent(pid)
            if pid == self.root:
                return True
            if pid <= 1:
                return False
        return False

    def _parent(self, pid: int) -> int:
        try:
            stat = (self._proc / str(pid) / "stat").read_text()
        except OSError:
            return 0
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses; it ends at the last ")".
        fields = stat[stat.rfind(")") + 2:].split()
        return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else 0


class SimulatedGpuMeter:
    """The run's share of one simulated GPU, from the GPU's own state file in ``gpu_dir``.

    A slot is the run's when its holder (asked of the kernel while the process lives) is one of the
    run's processes; a slot whose process has already exited is the run's when its pid is one the
    run's tree has had (CMD's own always: it is sampled before CMD is reaped) and it began after the
    run (``since_ns``, CLOCK_MONOTONIC)."""

    def __init__(self, gpu_dir: Path, processes: RunProcesses, since_ns: int) -> None:
        self._dir, self._processes, self._since_ns = gpu_dir, processes, since_ns
        self._seen = {processes.root}  # pids the run's tree has had
        self._records: dict[tuple[int, int], ProcRecord] = {}  # (slot, pid in the state) -> its latest record
        self._others: set[tuple[int, int]] = set()
        self._peak = 0
        self._memory = 0

    def sample(self) -> RunTotals:
        self._seen |= self._processes.tree()
        snapshot = sample_state(self._dir)
        if snapshot is not None:
            known = self._records.keys() | self._others
            self._classify([proc for proc in snapshot.procs if (proc.slot, proc.pid) not in known])
            live = 0
            for proc in snapshot.procs:
                key = (proc.slot, proc.pid)
                if key in self._records:
                    self._records[key] = proc
                    live += proc.mem_used if proc.alive else 0
            self._memory = live
            self._peak = max(self._peak, live)
        return RunTotals(busy_ns=sum(r.busy_ns for r in self._records.values()),
                         kernels=sum(r.kernels for r in self._records.values()),
                         memory_bytes=self._memory, peak_memory_bytes=self._peak)

    def _classify(self, unknown: list[ProcRecord]) -> None:
        holders = slot_holders(self._dir) if any(proc.alive for proc in unknown) else {}
        for proc in unknown:
            holder = holders.get(proc.slot) if proc.alive else None
            if holder is not None:
                ours = self._processes(holder)
            else:  # exited: known by its pid (the same PID namespace as CMD's)
                ours = proc.pid in self._seen and (proc.first_start_ns == 0 or proc.first_start_ns >= self._since_ns)
            if ours:
                self._records[(proc.slot, proc.pid)] = proc
            else:
                self._others.add((proc.slot, proc.pid))


class LedgerMeter:
    """The run's GPU memory as the arbiter's ledger has it (what the hook reserved for the pod's
    allocations), read through the hook protocol: one more connection of the pod, HELLO, then a
    0-byte ``MEM_RESERVE`` per sample, whose reply carries the pod's usage. It reconnects after the
    arbiter changes generation. The ledger knows no GPU time per pod outside the arbiter, and no kernels."""

    def __init__(self, socket_path: Path, pod: str, gpu_uuid: str, timeout_s: float = 1.0) -> None:
        self._path, self._pod, self._uuid, self._timeout_s = socket_path, pod, gpu_uuid, timeout_s
        self._socket: socket.socket | None = None
        self._reader = protocol.FrameReader()
        self._next_id = 1
        self._peak = self._memory = 0

    def sample(self) -> RunTotals:
        try:
            self._memory = self._read()
        except (OSError, protocol.ProtocolError, ValueError):
            self.close()  # the arbiter changed generation or is gone: the next sample reconnects
        self._peak = max(self._peak, self._memory)
        return RunTotals(busy_ns=None, kernels=None, memory_bytes=self._memory, peak_memory_bytes=self._peak)

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def _read(self) -> int:
        if self._socket is None:
            self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._socket.settimeout(self._timeout_s)
            self._socket.connect(str(self._path))
            self._reader = protocol.FrameReader()
            self._request(protocol.MessageType.HELLO, protocol.Hello(os.getpid(), self._pod, self._uuid).encode())
        reply = self._request(protocol.MessageType.MEM_RESERVE, protocol.encode_u64(0))
        return protocol.MemReserveReply.decode(reply.payload).pod_used_bytes

    def _request(self, message_type: int, payload: bytes) -> protocol.Frame:
        assert self._socket is not None
        request_id, self._next_id = self._next_id, self._next_id + 1
        self._socket.sendall(protocol.encode_frame(message_type, request_id, payload))
        while True:
            data = self._socket.recv(protocol.MAX_FRAME)
            if not data:
                raise ConnectionResetError("the arbiter closed the connection")
            for frame in self._reader.feed(data):
                if frame.request_id == request_id:
                    if frame.type != message_type | protocol.REPLY_BIT:
                        raise ValueError(f"the arbiter answered type {frame.type} to {message_type}")
                    return frame


@attrs.frozen
class ArbiterTotals:
    """A pod as the arbiter counted it: GPU time its hooks reported (s), tokens granted, how long its
    token requests waited (s), and the part of that wait it was at its own limit (throttled, s)."""

    used_s: float = 0.0
    tokens: int = 0
    waited_s: float = 0.0
    throttled_s: float = 0.0

    def __add__(self, other: ArbiterTotals) -> ArbiterTotals:
        return ArbiterTotals(self.used_s + other.used_s, self.tokens + other.tokens, self.waited_s + other.waited_s,
                             self.throttled_s + other.throttled_s)

    def __sub__(self, other: ArbiterTotals) -> ArbiterTotals:
        return ArbiterTotals(self.used_s - other.used_s, self.tokens - other.tokens, self.waited_s - other.waited_s,
                             self.throttled_s - other.throttled_s)


def pod_usage(document: object, pod: str) -> tuple[int, ArbiterTotals] | None:
    """A usage file's write number and ``pod``'s counters in it (zero when the pod is not in it), or None
    when ``document`` is not a usage file."""
    if not isinstance(document, dict) or not isinstance(document.get("pods"), list):
        return None
    sequence = document.get("sequence")
    if not isinstance(sequence, int):
        return None
    total = ArbiterTotals()
    try:
        for entry in document["pods"]:
            if isinstance(entry, dict) and entry.get("pod") == pod:
                total += ArbiterTotals(float(entry["usedSeconds"]), int(entry["tokens"]),
                                       float(entry["waitedSeconds"]), float(entry["throttledSeconds"]))
    except (KeyError, TypeError, ValueError):
        return None
    return sequence, total


class UsageAccount:
    """A pod's counters summed over the usage files of the arbiter generations it met, from a baseline:
    the counters a file had at the run's first reading (a pod of the same name before the run), zero in
    a file first seen later (a new arbiter counts from zero)."""

    def __init__(self) -> None:
        self._files: dict[Path, tuple[ArbiterTotals, ArbiterTotals]] = {}  # file -> (baseline, latest)

    def feed(self, source: Path, counters: ArbiterTotals, *, first_reading: bool) -> None:
        base = self._files[source][0] if source in self._files else counters if first_reading else ArbiterTotals()
        self._files[source] = (base, counters)

    def total(self) -> ArbiterTotals | None:
        """None until a file was read."""
        if not self._files:
            return None
        total = ArbiterTotals()
        for base, latest in self._files.values():
            total += latest - base
        return total


class ArbiterUsageMeter:
    """The run's pod in the arbiter's usage file: ``locate`` names the current generation's file,
    ``ask`` has the arbiter write it at once (False when no arbiter runs)."""

    def __init__(self, pod: str, locate: Callable[[], Path | None], ask: Callable[[], bool]) -> None:
        self._pod, self._locate, self._ask = pod, locate, ask
        self._account = UsageAccount()
        self._sampled = False

    def sample(self) -> ArbiterTotals | None:
        """The counters since the first sample (None while no usage file could be read)."""
        first, self._sampled = not self._sampled, True
        path = self._locate()
        read = self._read(path) if path is not None else None
        if path is not None and read is not None:
            self._account.feed(path, read[1], first_reading=first)
        return self._account.total()

    def final(self, timeout_s: float = FINAL_USAGE_TIMEOUT_S) -> ArbiterTotals | None:
        """The last reading, after CMD exited: from a write asked for now (waited for up to ``timeout_s``)."""
        path = self._locate()
        before = self._read(path) if path is not None else None
        if path is not None and self._ask():
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                now = self._read(path)
                if now is not None and (before is None or now[0] > before[0]):
                    break
                time.sleep(0.01)
        return self.sample()

    def _read(self, path: Path) -> tuple[int, ArbiterTotals] | None:
        try:
            return pod_usage(json.loads(path.read_text()), self._pod)
        except (OSError, ValueError):
            return None


def with_arbiter_time(totals: RunTotals, arbiter: ArbiterTotals | None) -> RunTotals:
    """A real GPU's totals: the run's GPU time is what its hooks reported to the arbiter (unknown without it)."""
    return attrs.evolve(totals, busy_ns=round(arbiter.used_s * 1e9) if arbiter is not None else None)
