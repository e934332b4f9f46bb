"""Reads the simulated GPU's shared state file: the independent measure of the GPU time each tenant got.

The simulated ``libcuda.so.1`` (``simgpu/driver``) keeps one state file per simulated GPU directory,
``<FASTGSHARE_FAKE_GPU_DIR>/fake_gpu.state``; its byte layout is documented and pinned by
``_Static_assert`` in ``simgpu/driver/fake_gpu_state.h`` and mirrored by the offsets here.
The reader takes no lock: it follows the file's seqlock (retry while the sequence number is odd or
changes during the copy), so it may sample while tenants run. Timestamps are CLOCK_MONOTONIC
nanoseconds, comparable with :func:`time.monotonic_ns`.

A slot is held by its process through a POSIX record lock on byte ``slot`` of
``<FASTGSHARE_FAKE_GPU_DIR>/fake_gpu.lock`` (the kernel drops it when the process exits, in any PID
namespace). :func:`slot_holders` asks the kernel who holds each byte, which names the holder by its
pid in the *reader's* PID namespace: a host-side tool maps a slot to the host pid and from there to
``/proc/<pid>/cgroup`` (the pod), while the ``pid`` in the state file is the one the process saw in
its own namespace.
"""

from __future__ import annotations

import fcntl
import os
import struct
import time
from pathlib import Path

import attrs

STATE_FILE = "fake_gpu.state"
LOCK_FILE = "fake_gpu.lock"
MAX_PROCS = 256
MAGIC = b"FGSFAKEG"
LAYOUT_VERSION = 1

_HEADER = struct.Struct("<8sIIIIQIIQQIIQQ16s")  # magic .. uuid, offsets 0..95
_PROC = struct.Struct("<iIIIIIQQQQQQQQQQ")  # one slot, offsets 0..103
_SEQ = struct.Struct("<Q")
_SEQ_OFFSET = 24
# struct flock on 64-bit Linux (x86_64, aarch64): l_type, l_whence, (pad), l_start, l_len, l_pid, (pad).
_FLOCK = struct.Struct("@hhqqi4x")
STATUS_FREE, STATUS_ALIVE, STATUS_EXITED = 0, 1, 2


class FakeGpuStateError(Exception):
    """The file is missing, of another layout, or never stopped changing long enough to copy."""


@attrs.frozen
class ProcRecord:
    pid: int
    status: int
    sm_units: int
    waiting_threads: int
    running: int
    wait_since_ns: int
    sm_held: int
    kernels: int
    busy_ns: int
    wait_ns: int
    first_start_ns: int
    last_end_ns: int
    mem_used: int
    ctx_syncs: int
    graph_launches: int
    slot: int = -1  # the slot's index in the state file (and its byte in the lock file)

    @property
    def alive(self) -> bool:
        return self.status == STATUS_ALIVE


@attrs.frozen
class FakeGpuSnapshot:
    sm_total: int
    sm_free: int
    mem_total: int
    mem_used: int
    running_kernels: int
    busy_since_ns: int
    device_busy_ns: int
    uuid: bytes
    procs: tuple[ProcRecord, ...]

    def by_pid(self, pid: int) -> ProcRecord:
        """The newest slot of ``pid`` (slots of exited processes keep their final numbers)."""
        matches = [proc for proc in self.procs if proc.pid == pid]
        if not matches:
            raise KeyError(f"no process {pid} on this fake GPU (pids: {[p.pid for p in self.procs]})")
        return max(matches, key=lambda proc: (proc.alive, proc.first_start_ns))


def _parse(data: bytes) -> FakeGpuSnapshot:
    (magic, version, header_size, proc_size, _max_procs, _seq, sm_total, sm_free, mem_total, mem_used,
     running_kernels, procs_used, busy_since_ns, device_busy_ns, uuid) = _HEADER.unpack_from(data)
    if magic == bytes(8):
        raise FakeGpuStateError("the state file is not initialised yet")
    if magic != MAGIC or version != LAYOUT_VERSION:
        raise FakeGpuStateError(f"not a fake GPU state file of layout {LAYOUT_VERSION} (magic {magic!r}, "
                                f"version {version})")
    procs = []
    for index in range(procs_used):
        (pid, status, sm_units, waiting, running, _reserved, wait_since_ns, sm_held, kernels, busy_ns, wait_ns,
         first_start_ns, last_end_ns, proc_mem_used, ctx_syncs, graph_launches) = _PROC.unpack_from(
            data, header_size + index * proc_size)
        if status != STATUS_FREE:
            procs.append(ProcRecord(pid, status, sm_units, waiting, running, wait_since_ns, sm_held, kernels, busy_ns,
                                    wait_ns, first_start_ns, last_end_ns, proc_mem_used, ctx_syncs, graph_launches,
                                    slot=index))
    return FakeGpuSnapshot(sm_total, sm_free, mem_total, mem_used, running_kernels, busy_since_ns,
                           device_busy_ns, uuid, tuple(procs))


def read_state(device_dir: Path, attempts: int = 10_000) -> FakeGpuSnapshot:
    """A consistent snapshot of the fake GPU in ``device_dir``; FakeGpuStateError if there is none (yet)."""
    path = device_dir / STATE_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise FakeGpuStateError(f"{path} does not exist: no process has used this fake GPU yet") from None
    try:
        size = os.fstat(fd).st_size
        if size < _HEADER.size:
            raise FakeGpuStateError(f"{path} is not initialised yet ({size} bytes)")
        for _ in range(attempts):
            data = os.pread(fd, size, 0)
            (before,) = _SEQ.unpack_from(data, _SEQ_OFFSET)
            (after,) = _SEQ.unpack(os.pread(fd, _SEQ.size, _SEQ_OFFSET))
            if before % 2 == 0 and before == after:
                return _parse(data)
            time.sleep(0)
    finally:
        os.close(fd)
    raise FakeGpuStateError(f"{path} kept changing for {attempts} attempts")


def sample_state(device_dir: Path) -> FakeGpuSnapshot | None:
    """Like :func:`read_state`, but None while no process has created the state file yet."""
    try:
        return read_state(device_dir)
    except FakeGpuStateError:
        return None


def slot_holders(device_dir: Path) -> dict[int, int]:
    """Slot index -> pid of the process holding that slot's lock, for every held slot.

    The pid is in the caller's PID namespace (the kernel translates it; 0 when the holder is not
    visible from here, e.g. a reader inside a pod looking at another pod). Empty when no process has
    used the fake GPU yet. The lock file is opened read-only and only queried (``F_GETLK``): this
    process takes no lock, so closing the file again drops nothing. Do not call it from a process
    that itself uses the fake GPU (closing any descriptor of the lock file in that process would
    release its own slot's lock).
    """
    try:
        fd = os.open(device_dir / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return {}
    holders = {}
    try:
        for slot in range(MAX_PROCS):
            query = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, slot, 1, 0)
            l_type, _whence, _start, _len, l_pid = _FLOCK.unpack(fcntl.fcntl(fd, fcntl.F_GETLK, query))
            if l_type != fcntl.F_UNLCK:
                holders[slot] = l_pid
    finally:
        os.close(fd)
    return holders
