"""CUDA IPC memory on the simulated GPU, across real processes: an exporter's allocation mapped by
importers (cuIpcGetMemHandle, cuIpcOpenMemHandle, cuIpcCloseMemHandle), the bytes shared both ways,
the GPU's memory counting the allocation once, stale and foreign handles refused.

Each peer is ``ipc_probe.py`` (ctypes on ``simgpu/build/libcuda.so.1``), driven by JSON lines; a
container's peer runs in its own PID and mount namespaces with just the GPU's two files bind-mounted
into a directory of its own, as the node agent gives pods the simulated GPU.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from simgpu.state import read_state
from tests.probe_process import ProbeProcess

HERE = Path(__file__).resolve().parent
PEER = HERE / "ipc_probe.py"

SUCCESS, INVALID_VALUE, INVALID_CONTEXT = 0, 1, 201
SIZE = 3 << 20  # not a multiple of the 2 MiB span: the tail must work too
MIB = 1 << 20


class Peer(ProbeProcess):
    """One ipc_probe.py process."""

    def __init__(self, build: Path, gpu_dir: Path, container: Path | None = None) -> None:
        """A peer on the GPU in ``gpu_dir``; with ``container``, in a container whose GPU directory is
        ``container`` holding bind mounts of the GPU's two files (they must exist: a peer on the host
        has attached)."""
        env = {**os.environ, "SIMGPU_DRIVER": str(build / "libcuda.so.1"), "FASTGSHARE_FAKE_GPU_DIR": str(gpu_dir),
               "FASTGSHARE_FAKE_GPU_MEMORY": "1G"}
        argv = [sys.executable, str(PEER)]
        if container is not None:
            env["FASTGSHARE_FAKE_GPU_DIR"] = str(container)
            script = []
            for name in ("fake_gpu.state", "fake_gpu.lock"):
                (container / name).touch()
                script.append(f"mount --bind {shlex.quote(str(gpu_dir / name))} {shlex.quote(str(container / name))}")
            script.append(f"exec {shlex.join(argv)}")
            argv = ["unshare", "--pid", "--fork", "--mount-proc", "--mount", "--propagation", "private",
                    "sh", "-ec", "\n".join(script)]
        super().__init__(argv, env, "ipc_probe")

    def exit(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.write(json.dumps({"op": "exit"}) + "\n")
            self.process.stdin.flush()
            assert self.process.wait(timeout=30) == 0

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)


@pytest.fixture
def peers(simgpu_build: Path, gpu_dir: Path) -> Iterator[list[Peer]]:
    """Three peers on one simulated GPU: an exporter and two importers."""
    started = [Peer(simgpu_build, gpu_dir) for _ in range(3)]
    yield started
    for peer in started:
        if peer.process.poll() is None:
            peer.kill()


def used(gpu_dir: Path) -> tuple[int, dict[int, int]]:
    """The GPU's memory in use, and each live process's, by pid."""
    state = read_state(gpu_dir)
    return state.mem_used, {p.pid: p.mem_used for p in state.procs if p.alive}


def test_importers_share_the_exporters_bytes_counted_once(peers: list[Peer], gpu_dir: Path) -> None:
    exporter, first, second = peers
    exporter("alloc", name="weights", size=SIZE, seed=1)
    handle = exporter("export", name="weights")
    assert handle["result"] == SUCCESS
    assert exporter("export", name="weights") == handle, "exporting again gives the same handle"
    assert exporter("check", name="weights", size=SIZE, seed=1)["matches"], "exporting kept the bytes"
    free_before = first("mem_free")["free"]

    mapped = []
    for importer in (first, second):
        opened = importer("open", name="w", handle=handle["handle"])
        assert opened["result"] == SUCCESS
        mapped.append(opened["ptr"])
        assert importer("check", name="w", size=SIZE, seed=1) == {"result": SUCCESS, "matches": True}
    assert first("open", name="w", handle=handle["handle"]) == {"result": SUCCESS, "ptr": mapped[0]}, \
        "opening again: the same pointer"
    assert first("pointer", name="w") == {"result": SUCCESS, "base": mapped[0], "extent": SIZE, "ptr": mapped[0]}

    # counted once, by the exporter: not again per importer
    total, by_pid = used(gpu_dir)
    assert total == SIZE
    assert by_pid == {exporter.pid: SIZE, first.pid: 0, second.pid: 0}
    assert first("mem_free")["free"] == free_before

    # writes are seen both ways, across the 2 MiB boundary and in the tail
    assert first("write", name="w", size=2 * MIB, seed=2, offset=MIB // 2) == {"result": SUCCESS}
    assert exporter("check", name="weights", size=2 * MIB, seed=2, offset=MIB // 2)["matches"]
    assert second("check", name="w", size=2 * MIB, seed=2, offset=MIB // 2)["matches"]
    assert exporter("write", name="weights", size=4096, seed=3, offset=SIZE - 4096) == {"result": SUCCESS}
    assert first("check", name="w", size=4096, seed=3, offset=SIZE - 4096)["matches"]
    assert first("read", name="w", size=16, offset=SIZE - 8)["result"] == INVALID_VALUE, "past the allocation"

    # an imported mapping is not the importer's allocation
    assert first("free", name="w")["result"] == INVALID_VALUE
    assert [first("close", name="w")["result"] for _ in range(3)] == [SUCCESS, SUCCESS, INVALID_VALUE], \
        "opened twice: closed twice, then it is no longer mapped"
    assert first("read", name="w", size=16)["result"] == INVALID_VALUE
    assert second("close", name="w")["result"] == SUCCESS

    # freed by the exporter: the handle is stale, and stays so when the address is reused
    assert exporter("free", name="weights")["result"] == SUCCESS
    assert used(gpu_dir)[0] == 0
    assert first("open", name="stale", handle=handle["handle"])["result"] == INVALID_VALUE
    exporter("alloc", name="again", size=SIZE, seed=4)
    fresh = exporter("export", name="again")
    assert fresh["result"] == SUCCESS
    old, new = bytes.fromhex(handle["handle"]), bytes.fromhex(fresh["handle"])
    assert new[24:28] == old[24:28], "the freed entry is reused (bytes 24..27 of the handle: its index)"
    assert new[28:32] != old[28:32], "with a new generation (bytes 28..31)"
    assert first("open", name="stale", handle=handle["handle"])["result"] == INVALID_VALUE
    assert first("open", name="fresh", handle=fresh["handle"], v1=True)["result"] == SUCCESS
    assert first("check", name="fresh", size=SIZE, seed=4)["matches"]
    assert first("close", name="fresh")["result"] == SUCCESS
    for peer in peers:
        peer.exit()


def test_bad_pointers_and_handles_are_refused(peers: list[Peer]) -> None:
    exporter, importer, _ = peers
    exporter("alloc", name="a", size=MIB, seed=1)
    assert exporter("export", name="a", offset=256)["result"] == INVALID_VALUE, "not the base of an allocation"
    assert exporter("export_managed")["result"] == INVALID_VALUE, "managed memory has no IPC handle"
    handle = exporter("export", name="a")["handle"]
    assert exporter("open", name="own", handle=handle)["result"] == INVALID_CONTEXT, "the exporter's own handle"
    garbage = "ab" * 64
    assert importer("open", name="g", handle=garbage)["result"] == INVALID_VALUE
    assert importer("open", name="z", handle="00" * 64)["result"] == INVALID_VALUE
    other_entry = bytearray(bytes.fromhex(handle))
    other_entry[24] ^= 0x01  # another table entry, never exported
    assert importer("open", name="o", handle=other_entry.hex())["result"] == INVALID_VALUE
    other_gpu = bytearray(bytes.fromhex(handle))
    other_gpu[8] ^= 0xFF  # the UUID of another GPU
    assert importer("open", name="u", handle=other_gpu.hex())["result"] == INVALID_VALUE
    assert importer("open", name="f", handle=handle, flags=2)["result"] == INVALID_VALUE, "an unknown flag"
    assert importer("open", name="f", handle=handle, flags=0)["result"] == INVALID_VALUE, \
        "the flag must be CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS (an H200 on driver 580 refuses 0 too)"
    assert importer("open", name="ok", handle=handle)["result"] == SUCCESS
    assert importer("close", name="ok")["result"] == SUCCESS


def test_a_mapping_outlives_its_dead_exporter_until_closed(peers: list[Peer], gpu_dir: Path,
                                                           simgpu_build: Path) -> None:
    exporter, importer, late = peers
    exporter("alloc", name="a", size=SIZE, seed=5)
    handle = exporter("export", name="a")["handle"]
    assert importer("open", name="a", handle=handle)["result"] == SUCCESS
    exporter.kill()
    assert late("open", name="a", handle=handle)["result"] == INVALID_VALUE, "its exporter is gone"
    assert importer("check", name="a", size=SIZE, seed=5)["matches"], "the importer's mapping keeps the bytes"
    assert importer("close", name="a")["result"] == SUCCESS
    # the next export gives the dead exporter's file range back: the lock file stays sparse
    late("alloc", name="b", size=MIB, seed=6)
    assert late("export", name="b")["result"] == SUCCESS
    Peer(simgpu_build, gpu_dir).exit()  # a process attaching reaps the dead exporter's slot
    assert used(gpu_dir)[0] == MIB, "the dead exporter's allocation is no longer counted"
    lock_file = os.stat(gpu_dir / "fake_gpu.lock")
    assert lock_file.st_blocks * 512 < 2 * SIZE, f"{lock_file.st_blocks * 512} bytes still held in the lock file"


def _can_contain() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "--mount", "--propagation", "private",
                            "true"], capture_output=True, check=False)
    return probe.returncode == 0


@pytest.mark.skipif(not _can_contain(), reason="needs root and unshare --pid --mount (util-linux)")
def test_containers_given_just_the_two_files_share_ipc_memory(simgpu_build: Path, gpu_dir: Path,
                                                              tmp_path: Path) -> None:
    exporter = Peer(simgpu_build, gpu_dir)
    containers = [tmp_path / "pod-a", tmp_path / "pod-b"]
    started = [exporter]
    try:
        exporter("alloc", name="weights", size=SIZE, seed=7)
        handle = exporter("export", name="weights")["handle"]
        for root in containers:
            root.mkdir()
            started.append(Peer(simgpu_build, gpu_dir, container=root))
        first, second = started[1:]
        assert first.pid == second.pid == 1, "each in a PID namespace of its own"
        for importer in (first, second):
            assert importer("open", name="w", handle=handle)["result"] == SUCCESS
            assert importer("check", name="w", size=SIZE, seed=7)["matches"]
        assert first("write", name="w", size=4096, seed=8, offset=MIB) == {"result": SUCCESS}
        assert second("check", name="w", size=4096, seed=8, offset=MIB)["matches"]
        assert exporter("check", name="weights", size=4096, seed=8, offset=MIB)["matches"]
        state = read_state(gpu_dir)  # both importers are pid 1: by slot, not by pid
        assert state.mem_used == SIZE, "counted once, however many containers map it"
        assert sorted(p.mem_used for p in state.procs if p.alive) == [0, 0, SIZE]
        for importer in (first, second):
            assert importer("close", name="w")["result"] == SUCCESS
        assert exporter("free", name="weights")["result"] == SUCCESS
        assert first("open", name="stale", handle=handle)["result"] == INVALID_VALUE
        for peer in started:
            peer.exit()
    finally:
        for peer in started:
            if peer.process.poll() is None:
                peer.kill()
