"""A pod's process of the GPU day's model-sharing part (``f_model_sharing``), and the part's observer
of the GPU's used memory. It imports nothing of fastgshare: it is a function's own code, calling the
CUDA driver through ctypes as any Python program may.

    python3 model_pod.py open [--name NAME] [--windows N] [--window-bytes W] [--no-hold]
    python3 model_pod.py copy --file FILE [--windows N] [--window-bytes W] [--no-hold]
    python3 model_pod.py observe

``open`` (under the hook): makes the primary context current, reads ``cuMemGetInfo`` (the pod's view
under the hook), maps the pod's model with the hook's ``fastgshare_model_open`` (found with
``ctypes.CDLL(None)``, as fastgshare_model.h says), reads ``cuMemGetInfo`` again, copies ``--windows``
windows of the weights back (``cuMemcpyDtoH``, spread from the first byte to the last) and prints
one JSON line: ``pid``, ``ptr``, ``bytes``, ``meminfo_before``/``meminfo_after`` (``free``,
``total``), ``ms`` (the open) and ``windows`` (``offset``, ``length``, ``sha256``, or ``error``); a
failed open prints ``{"error", "stage": "open", "code"}`` and exits 1. ``copy`` does the same with
its own copy instead: ``cuMemAlloc`` of the file's size and ``cuMemcpyHtoD`` of the file, 8 MiB at a
time. Then, unless ``--no-hold``, it keeps the mapping or the copy until a line (or the end) on
stdin, releases it (``fastgshare_model_close`` or ``cuMemFree``), prints ``{"released": CUresult}``
and exits.

The driver is loaded ``RTLD_GLOBAL`` and every call is looked up in the process's global scope, so
that under the hook (``LD_PRELOAD``) the hook's wrappers answer (``cuMemAlloc``, ``cuMemGetInfo``)
and the driver the rest, as for any program linked against libcuda.

``observe`` (no hook): the GPU's used memory, one JSON line per line read on stdin (first at start):
``{"used", "total", "by"}``, from NVML (``libnvidia-ml.so.1``, device 0: needs no context, so the
observer costs the GPU nothing); where NVML cannot answer, ``total - free`` of ``cuMemGetInfo`` in a
context of its own (``"by": "cuMemGetInfo"``, the observer's context included in every reading).
"""

from __future__ import annotations

import argparse
import ctypes as C
import hashlib
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

CHUNK = 8 << 20
PAGE = 4096


class Failed(Exception):
    """A step failed; ``stage`` names it, ``code`` is the CUresult or the model API's code."""

    def __init__(self, stage: str, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.stage, self.code = stage, code


class Driver:
    """The driver calls of a pod's process, through the process's global scope (the hook first)."""

    def __init__(self) -> None:
        try:
            C.CDLL("libcuda.so.1", mode=C.RTLD_GLOBAL)
        except OSError as error:
            raise Failed("load", f"cannot load libcuda.so.1: {error}") from None
        api = C.CDLL(None)
        u64, size_t = C.c_uint64, C.c_size_t
        api.cuInit.argtypes = [C.c_uint]
        api.cuDeviceGet.argtypes = [C.POINTER(C.c_int), C.c_int]
        api.cuDevicePrimaryCtxRetain.argtypes = [C.POINTER(C.c_void_p), C.c_int]
        api.cuCtxSetCurrent.argtypes = [C.c_void_p]
        api.cuMemGetInfo_v2.argtypes = [C.POINTER(size_t), C.POINTER(size_t)]
        api.cuMemAlloc_v2.argtypes = [C.POINTER(u64), size_t]
        api.cuMemFree_v2.argtypes = [u64]
        api.cuMemcpyHtoD_v2.argtypes = [u64, C.c_void_p, size_t]
        api.cuMemcpyDtoH_v2.argtypes = [C.c_void_p, u64, size_t]
        api.cuGetErrorName.argtypes = [C.c_int, C.POINTER(C.c_char_p)]
        self.api = api

    def check(self, result: int, what: str) -> None:
        if result != 0:
            name = C.c_char_p()
            if self.api.cuGetErrorName(result, C.byref(name)) == 0 and name.value:
                label = f"{name.value.decode(errors='replace')} ({result})"
            else:
                label = f"CUresult {result}"
            raise Failed(what, f"{what} failed: {label}", result)

    def context(self) -> None:
        device, context = C.c_int(), C.c_void_p()
        self.check(self.api.cuInit(0), "cuInit")
        self.check(self.api.cuDeviceGet(C.byref(device), 0), "cuDeviceGet")
        self.check(self.api.cuDevicePrimaryCtxRetain(C.byref(context), device), "cuDevicePrimaryCtxRetain")
        self.check(self.api.cuCtxSetCurrent(context), "cuCtxSetCurrent")

    def mem_get_info(self) -> dict[str, int]:
        free, total = C.c_size_t(), C.c_size_t()
        self.check(self.api.cuMemGetInfo_v2(C.byref(free), C.byref(total)), "cuMemGetInfo")
        return {"free": free.value, "total": total.value}


def model_api() -> Any:
    """The hook's model API (fastgshare_model.h), or Failed when the process runs without the hook."""
    hook = C.CDLL(None)
    try:
        hook.fastgshare_model_open.argtypes = [C.c_char_p, C.POINTER(C.c_uint64), C.POINTER(C.c_size_t)]
    except AttributeError:
        raise Failed("open", "fastgshare_model_open not found: the process runs without the hook "
                     "(LD_PRELOAD)") from None
    hook.fastgshare_model_close.argtypes = [C.c_uint64]
    hook.fastgshare_model_error.restype = C.c_char_p
    return hook


def open_model(name: str | None) -> tuple[Any, int, int]:
    hook = model_api()
    pointer, size = C.c_uint64(), C.c_size_t()
    code = hook.fastgshare_model_open(name.encode() if name else None, C.byref(pointer), C.byref(size))
    if code != 0:
        raise Failed("open", (hook.fastgshare_model_error() or b"").decode(errors="replace"), code)
    return hook, pointer.value, size.value


def load_copy(driver: Driver, path: str) -> tuple[int, int]:
    """Its own copy of the file: cuMemAlloc and cuMemcpyHtoD, CHUNK bytes at a time."""
    size = os.path.getsize(path)
    pointer = C.c_uint64()
    driver.check(driver.api.cuMemAlloc_v2(C.byref(pointer), size), f"cuMemAlloc of {size} bytes")
    buffer = C.create_string_buffer(min(CHUNK, size))
    view = memoryview(buffer).cast("B")
    done = 0
    with open(path, "rb", buffering=0) as file:
        while done < size:
            got = file.readinto(view[:min(len(view), size - done)])
            if not got:
                raise Failed("copy", f"{path} ended after {done} of {size} bytes")
            driver.check(driver.api.cuMemcpyHtoD_v2(pointer.value + done, buffer, got), "cuMemcpyHtoD")
            done += got
    return pointer.value, size


def window_offsets(size: int, count: int, length: int) -> list[int]:
    """``count`` offsets from 0 to the last window, page-aligned (the last one ends at the last byte)."""
    last = size - length
    if count <= 1 or last <= 0:
        return [0]
    return sorted({0, last, *(last * index // (count - 1) // PAGE * PAGE for index in range(count))})


def read_windows(driver: Driver, pointer: int, size: int, count: int, length: int) -> list[dict[str, object]]:
    length = min(length, size)
    buffer = C.create_string_buffer(length)
    windows: list[dict[str, object]] = []
    for offset in window_offsets(size, count, length):
        result = driver.api.cuMemcpyDtoH_v2(buffer, pointer + offset, length)
        if result != 0:
            windows.append({"offset": offset, "length": length, "error": f"cuMemcpyDtoH: CUresult {result}"})
        else:
            windows.append({"offset": offset, "length": length,
                            "sha256": hashlib.sha256(C.string_at(buffer, length)).hexdigest()})
    return windows


def pod(args: argparse.Namespace) -> int:
    driver = Driver()
    driver.context()
    before = driver.mem_get_info()
    began = time.monotonic()
    hook = None
    if args.mode == "open":
        hook, pointer, size = open_model(args.name)
    else:
        pointer, size = load_copy(driver, args.file)
    ms = (time.monotonic() - began) * 1e3
    after = driver.mem_get_info()
    windows = read_windows(driver, pointer, size, args.windows, args.window_bytes)
    print(json.dumps({"pid": os.getpid(), "mode": args.mode, "ptr": pointer, "bytes": size, "ms": round(ms, 2),
                      "meminfo_before": before, "meminfo_after": after, "windows": windows}), flush=True)
    if args.no_hold:
        return 0
    sys.stdin.readline()
    released = hook.fastgshare_model_close(pointer) if hook is not None else driver.api.cuMemFree_v2(pointer)
    print(json.dumps({"released": released}), flush=True)
    return 0


class Nvml:
    """NVML's memory of device 0 (ctypes on libnvidia-ml.so.1); ``why`` is set where it cannot answer."""

    class Memory(C.Structure):
        _fields_ = [("total", C.c_ulonglong), ("free", C.c_ulonglong), ("used", C.c_ulonglong)]

    def __init__(self) -> None:
        self.why = ""
        self.device = C.c_void_p()
        try:
            self.lib = C.CDLL("libnvidia-ml.so.1")
            if self.lib.nvmlInit_v2() != 0 or self.lib.nvmlDeviceGetHandleByIndex_v2(0, C.byref(self.device)) != 0:
                self.why = "nvmlInit_v2 or nvmlDeviceGetHandleByIndex_v2 failed"
        except (OSError, AttributeError) as error:
            self.why = f"libnvidia-ml.so.1: {error}"

    def used(self) -> dict[str, object] | None:
        if self.why:
            return None
        memory = self.Memory()
        if self.lib.nvmlDeviceGetMemoryInfo(self.device, C.byref(memory)) != 0:
            return None
        return {"used": memory.used, "total": memory.total, "by": "nvml"}


def observe() -> int:
    nvml = Nvml()
    driver: Driver | None = None
    if nvml.used() is None:
        driver = Driver()
        driver.context()
    while True:
        reading = nvml.used()
        if reading is None:
            if driver is None:  # NVML stopped answering: a context of its own from now on
                driver = Driver()
                driver.context()
            info = driver.mem_get_info()
            reading = {"used": info["total"] - info["free"], "total": info["total"], "by": "cuMemGetInfo",
                       "nvml": nvml.why or "nvmlDeviceGetMemoryInfo failed"}
        print(json.dumps(reading), flush=True)
        if not sys.stdin.readline():
            return 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["open", "copy", "observe"])
    parser.add_argument("--name", help="open: the model's name (default: the pod's model)")
    parser.add_argument("--file", help="copy: the weights file")
    parser.add_argument("--windows", type=int, default=16, help="windows of the weights to read back")
    parser.add_argument("--window-bytes", type=int, default=64 << 10, help="bytes of each window")
    parser.add_argument("--no-hold", action="store_true", help="exit after the result, without waiting")
    args = parser.parse_args(argv)
    if args.mode == "copy" and not args.file:
        parser.error("copy needs --file FILE")
    if args.windows < 1 or args.window_bytes < 1:
        parser.error(f"--windows {args.windows}, --window-bytes {args.window_bytes}: allowed: 1 or more")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return observe() if args.mode == "observe" else pod(args)
    except Failed as failure:
        print(json.dumps({"error": str(failure), "stage": failure.stage, "code": failure.code}), flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
