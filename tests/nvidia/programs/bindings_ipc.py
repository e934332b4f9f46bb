"""A cuda-bindings tenant sharing device memory through CUDA IPC, run under the hook on the simulated
GPU by tests/nvidia/test_cuda_bindings_ipc.py: the exporter allocates and exports, an importer in
another process (another pod) maps the handle, reads what the exporter wrote and writes back.

``--role export``: cuMemAlloc ``--size`` bytes, a pattern copied in, cuIpcGetMemHandle written to
``--handle-file``; then it waits for ``--done-file`` (the importer's), checks the importer's write,
frees, and writes ``pattern_seen_after_import`` and the CUresult names of the calls. ``--role
import``: waits for the handle, cuIpcOpenMemHandle (``CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS``),
cuMemGetInfo before and after (what the pod is charged), reads the pattern, overwrites the first
page, cuIpcCloseMemHandle, touches the done file. ``--role stale``: opens the handle after its
exporter freed it and writes the CUresult name it got. Handles travel as 64 raw bytes in a file.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time
from pathlib import Path
from typing import Any

from cuda.bindings import driver
from driver_calls import DriverError, call, error_name, fail, primary_context, write_result
from trace_calls import install_from_env

HANDLE_SIZE = 64  # CU_IPC_HANDLE_SIZE
PAGE = 4096


def pattern(nbytes: int, seed: int) -> bytes:
    return bytes((i * 7 + seed) % 251 for i in range(nbytes))


def wait_for(path: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear in {timeout_s:.0f} s")
        time.sleep(0.05)


def handle_bytes(handle: Any) -> bytes:
    return ctypes.string_at(handle.getPtr(), HANDLE_SIZE)


def handle_from(raw: bytes) -> Any:
    handle = driver.CUipcMemHandle()
    ctypes.memmove(handle.getPtr(), raw, HANDLE_SIZE)
    return handle


def read(pointer: Any, nbytes: int) -> bytes:
    out = bytearray(nbytes)
    buffer = (ctypes.c_char * nbytes).from_buffer(out)
    call(driver.cuMemcpyDtoH, ctypes.addressof(buffer), pointer, nbytes)
    return bytes(out)


def export(args: argparse.Namespace) -> dict[str, Any]:
    pointer = call(driver.cuMemAlloc, args.size)
    call(driver.cuMemcpyHtoD, pointer, pattern(args.size, 1), args.size)
    handle = call(driver.cuIpcGetMemHandle, pointer)
    not_base = error_name(driver.cuIpcGetMemHandle, driver.CUdeviceptr(int(pointer) + 256))[0]
    own = error_name(driver.cuIpcOpenMemHandle, handle,
                     driver.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)[0]
    staging = Path(f"{args.handle_file}.tmp")
    staging.write_bytes(handle_bytes(handle))
    staging.replace(args.handle_file)
    wait_for(Path(args.done_file))
    seen = read(pointer, args.size)
    expected = pattern(PAGE, 2) + pattern(args.size, 1)[PAGE:]
    free, _ = call(driver.cuMemGetInfo)
    call(driver.cuMemFree, pointer)
    return {"pattern_seen_after_import": seen == expected, "not_base": not_base, "own_handle": own,
            "free_while_held": int(free)}


def import_(args: argparse.Namespace) -> dict[str, Any]:
    wait_for(Path(args.handle_file))
    handle = handle_from(Path(args.handle_file).read_bytes())
    before, _ = call(driver.cuMemGetInfo)
    pointer = call(driver.cuIpcOpenMemHandle, handle, driver.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
    after, total = call(driver.cuMemGetInfo)
    matches = read(pointer, args.size) == pattern(args.size, 1)
    call(driver.cuMemcpyHtoD, pointer, pattern(PAGE, 2), PAGE)
    call(driver.cuIpcCloseMemHandle, pointer)
    garbage = error_name(driver.cuIpcOpenMemHandle, handle_from(b"\xab" * HANDLE_SIZE),
                         driver.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)[0]
    Path(args.done_file).touch()
    return {"free_before_open": int(before), "free_after_open": int(after), "total": int(total),
            "pattern_matches": matches, "garbage": garbage}


def stale(args: argparse.Namespace) -> dict[str, Any]:
    handle = handle_from(Path(args.handle_file).read_bytes())
    code = error_name(driver.cuIpcOpenMemHandle, handle, driver.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)[0]
    return {"stale": code}


def main() -> int:
    install_from_env()
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--role", choices=("export", "import", "stale"), required=True)
    parser.add_argument("--handle-file", required=True)
    parser.add_argument("--done-file", required=True)
    parser.add_argument("--size", type=int, default=3 << 20)
    args = parser.parse_args()
    try:
        primary_context()
        roles = {"export": export, "import": import_, "stale": stale}
        write_result(args.out, roles[args.role](args))
    except (DriverError, OSError, TimeoutError) as error:
        fail(args.out, error)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
