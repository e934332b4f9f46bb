"""A CUDA IPC memory peer for test_ipc_memory.py: a real process on the simulated ``libcuda.so.1``
(ctypes) that allocates, exports, opens, reads, writes, frees and closes as the test tells it.

``python ipc_probe.py``, with the library's path in
``SIMGPU_DRIVER`` and the simulated GPU in ``FASTGSHARE_FAKE_GPU_DIR``. It reads one command a line
on stdin (``{"op": ..., ...}``) and answers each with one JSON line on stdout; it asserts nothing
(the test does). A driver call it needs to go on and that fails ends it with one line naming it.
"""

from __future__ import annotations

import ctypes as C
import json
import os
import sys
from collections.abc import Callable
from typing import Any

lib = C.CDLL(os.environ["SIMGPU_DRIVER"])
HANDLE_SIZE = 64  # CU_IPC_HANDLE_SIZE


class IpcMemHandle(C.Structure):
    """CUipcMemHandle: 64 opaque bytes, passed by value."""

    _fields_ = [("reserved", C.c_char * HANDLE_SIZE)]


lib.cuIpcOpenMemHandle_v2.argtypes = [C.POINTER(C.c_uint64), IpcMemHandle, C.c_uint]
lib.cuIpcOpenMemHandle.argtypes = [C.POINTER(C.c_uint64), IpcMemHandle, C.c_uint]


def need(result: int, what: str) -> None:
    if result != 0:
        raise SystemExit(f"ipc_probe: {what} returned CUresult {result}")


def pattern(nbytes: int, seed: int) -> bytes:
    return bytes((i * 7 + seed) % 251 for i in range(nbytes))


def handle_of(text: str) -> IpcMemHandle:
    raw = bytes.fromhex(text)
    handle = IpcMemHandle()
    C.memmove(C.addressof(handle), raw, HANDLE_SIZE)
    return handle


def read(ptr: int, nbytes: int) -> tuple[int, bytes]:
    out = C.create_string_buffer(nbytes)
    return lib.cuMemcpyDtoH_v2(out, C.c_uint64(ptr), C.c_size_t(nbytes)), out.raw


def mem_free() -> int:
    free, total = C.c_size_t(), C.c_size_t()
    need(lib.cuMemGetInfo_v2(C.byref(free), C.byref(total)), "cuMemGetInfo_v2")
    return free.value


class Peer:
    """One process's allocations (exporter) or mappings (importer), by the name the test gives."""

    def __init__(self) -> None:
        need(lib.cuInit(0), "cuInit")
        ctx = C.c_void_p()
        need(lib.cuDevicePrimaryCtxRetain(C.byref(ctx), 0), "cuDevicePrimaryCtxRetain")
        need(lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        self.ptrs: dict[str, int] = {}

    def alloc(self, name: str, size: int, seed: int) -> dict[str, Any]:
        ptr = C.c_uint64()
        need(lib.cuMemAlloc_v2(C.byref(ptr), C.c_size_t(size)), "cuMemAlloc_v2")
        need(lib.cuMemcpyHtoD_v2(ptr, pattern(size, seed), C.c_size_t(size)), "cuMemcpyHtoD_v2")
        self.ptrs[name] = ptr.value
        return {"ptr": ptr.value}

    def export(self, name: str, offset: int = 0) -> dict[str, Any]:
        handle = IpcMemHandle()
        result = lib.cuIpcGetMemHandle(C.byref(handle), C.c_uint64(self.ptrs[name] + offset))
        return {"result": result, "handle": C.string_at(C.addressof(handle), HANDLE_SIZE).hex()}

    def export_managed(self) -> dict[str, Any]:
        ptr = C.c_uint64()
        need(lib.cuMemAllocManaged(C.byref(ptr), C.c_size_t(4096), 1), "cuMemAllocManaged")
        return {"result": lib.cuIpcGetMemHandle(C.byref(IpcMemHandle()), ptr)}

    def open(self, name: str, handle: str, flags: int = 1, v1: bool = False) -> dict[str, Any]:
        ptr = C.c_uint64()
        fn = lib.cuIpcOpenMemHandle if v1 else lib.cuIpcOpenMemHandle_v2
        result = fn(C.byref(ptr), handle_of(handle), flags)
        if result == 0:
            self.ptrs[name] = ptr.value
        return {"result": result, "ptr": ptr.value}

    def read(self, name: str, size: int, offset: int = 0) -> dict[str, Any]:
        result, data = read(self.ptrs[name] + offset, size)
        return {"result": result, "data": data.hex()}

    def check(self, name: str, size: int, seed: int, offset: int = 0) -> dict[str, Any]:
        result, data = read(self.ptrs[name] + offset, size)
        return {"result": result, "matches": data == pattern(size, seed)}

    def write(self, name: str, size: int, seed: int, offset: int = 0) -> dict[str, Any]:
        result = lib.cuMemcpyHtoD_v2(C.c_uint64(self.ptrs[name] + offset), pattern(size, seed), C.c_size_t(size))
        return {"result": result}

    def free(self, name: str) -> dict[str, Any]:
        return {"result": lib.cuMemFree_v2(C.c_uint64(self.ptrs[name]))}

    def close(self, name: str) -> dict[str, Any]:
        return {"result": lib.cuIpcCloseMemHandle(C.c_uint64(self.ptrs[name]))}

    def mem_free(self) -> dict[str, Any]:
        return {"free": mem_free()}

    def pointer(self, name: str) -> dict[str, Any]:
        base, extent = C.c_uint64(), C.c_size_t()
        result = lib.cuMemGetAddressRange_v2(C.byref(base), C.byref(extent), C.c_uint64(self.ptrs[name] + 1))
        return {"result": result, "base": base.value, "extent": extent.value, "ptr": self.ptrs[name]}


def main() -> None:
    peer = Peer()
    ops: dict[str, Callable[..., dict[str, Any]]] = {
        name: getattr(peer, name) for name in ("alloc", "export", "export_managed", "open", "read", "check",
                                               "write", "free", "close", "mem_free", "pointer")}
    print(json.dumps({"ready": True, "pid": os.getpid()}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        op = command.pop("op")
        if op == "exit":
            break
        print(json.dumps(ops[op](**command)), flush=True)


if __name__ == "__main__":
    main()
