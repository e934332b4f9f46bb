"""Reads the fake GPU's shared state file: the independent measure of the GPU time each tenant got.

The fake ``libcuda.so.1`` (``vgpu_hook/fake_driver``) keeps one state file per fake GPU directory,
``<FASTGSHARE_FAKE_GPU_DIR>/fake_gpu.state``; its byte layout is documented and pinned by
``_Static_assert`` in ``vgpu_hook/fake_driver/fake_gpu_state.h`` and mirrored by the offsets here.
The reader takes no lock: it follows the file's seqlock (retry while the sequence number is odd or
changes during the copy), so it may sample while tenants run. Timestamps are CLOCK_MONOTONIC
nanoseconds, comparable with :func:`time.monotonic_ns`.
"""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

import attrs

STATE_FILE = "fake_gpu.state"
MAGIC = b"FGSFAKEG"
LAYOUT_VERSION = 1

_HEADER = struct.Struct("<8sIIIIQIIQQIIQQ16s")  # magic .. uuid, offsets 0..95
_PROC = struct.Struct("<iIIIIIQQQQQQQQQQ")  # one slot, offsets 0..103
_SEQ = struct.Struct("<Q")
_SEQ_OFFSET = 24
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
        fields = _PROC.unpack_from(data, header_size + index * proc_size)
        pid, status, sm_units, waiting, running, _reserved, *counters = fields
        if status != STATUS_FREE:
            procs.append(ProcRecord(pid, status, sm_units, waiting, running, *counters))
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
