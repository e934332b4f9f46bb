"""An NVRTC tenant: compiles a real CUDA C++ kernel to PTX with NVIDIA's runtime compiler, loads the
PTX through the driver (cuModuleLoadData via cuda-bindings), sets a module-scope variable
(cuModuleGetGlobal, cuMemcpyHtoD) and launches the kernel in a loop on a stream for ``--seconds``,
waiting for the stream every ``--sync-every`` launches (an iteration that reads its result, as a
training or serving loop does), timing the loop with events. Run under the hook on the simulated
GPU by tests/nvidia/test_nvrtc.py, two at once at different shares.

Writes one JSON object to ``--out``: ``arch`` (the compute capability it compiled for),
``ptx_bytes``, ``entry`` (whether the PTX defines the kernel's entry), ``global_bytes`` (the
variable's size as cuModuleGetGlobal reports it), ``launches``, ``elapsed_ms`` (cuEventElapsedTime
over the loop), ``frees`` (CUresult names).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np
from cuda.bindings import driver, nvrtc
from driver_calls import DriverError, call, error_name, fail, primary_context, write_result
from trace_calls import install_from_env

KERNEL_NAME = "scale"
GLOBAL_NAME = "bias"
SOURCE = b"""
__device__ float bias;

extern "C" __global__ void scale(float *data, float factor, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        data[i] = data[i] * factor + bias;
}
"""
ELEMENTS = 1 << 16
THREADS = 256


class CompileError(RuntimeError):
    """NVRTC refused the program; the message carries its log."""


def nvrtc_call(function: Any, *args: Any) -> Any:
    result = function(*args)
    if result[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CompileError(f"{function.__name__} returned {result[0].name}")
    return result[1] if len(result) > 1 else None


def compile_ptx(arch: str) -> bytes:
    """The kernel's PTX for ``compute_<arch>``; raises CompileError with NVRTC's log."""
    program = nvrtc_call(nvrtc.nvrtcCreateProgram, SOURCE, b"scale.cu", 0, [], [])
    options = [f"--gpu-architecture=compute_{arch}".encode()]
    try:
        nvrtc_call(nvrtc.nvrtcCompileProgram, program, len(options), options)
    except CompileError as error:
        size = nvrtc_call(nvrtc.nvrtcGetProgramLogSize, program)
        log = b" " * size
        nvrtc_call(nvrtc.nvrtcGetProgramLog, program, log)
        raise CompileError(f"{error}: {log.decode(errors='replace')}") from None
    size = nvrtc_call(nvrtc.nvrtcGetPTXSize, program)
    ptx = b" " * size
    nvrtc_call(nvrtc.nvrtcGetPTX, program, ptx)
    nvrtc_call(nvrtc.nvrtcDestroyProgram, program)
    return ptx


def launch_loop(function: Any, pointer: Any, seconds: float, sync_every: int) -> tuple[int, float]:
    """Launch the kernel on a new stream until ``seconds`` pass: (launches, event-timed ms)."""
    stream = call(driver.cuStreamCreate, 0)
    start, stop = call(driver.cuEventCreate, 0), call(driver.cuEventCreate, 0)
    values = [np.array([int(pointer)], dtype=np.uint64), np.array([2.0], dtype=np.float32),
              np.array([ELEMENTS], dtype=np.int32)]
    params = np.array([value.ctypes.data for value in values], dtype=np.uint64)
    blocks = (ELEMENTS + THREADS - 1) // THREADS
    launches, deadline = 0, time.monotonic() + seconds
    call(driver.cuEventRecord, start, stream)
    while time.monotonic() < deadline:
        call(driver.cuLaunchKernel, function, blocks, 1, 1, THREADS, 1, 1, 0, stream, params.ctypes.data, 0)
        launches += 1
        if launches % sync_every == 0:
            call(driver.cuStreamSynchronize, stream)
    call(driver.cuEventRecord, stop, stream)
    call(driver.cuStreamSynchronize, stream)
    elapsed = float(call(driver.cuEventElapsedTime, start, stop))
    for event in (start, stop):
        call(driver.cuEventDestroy, event)
    call(driver.cuStreamDestroy, stream)
    return launches, elapsed


def main() -> int:
    install_from_env()
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--sync-every", type=int, default=10)
    args = parser.parse_args()
    try:
        device, _ = primary_context()
        major = call(driver.cuDeviceGetAttribute,
                     driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device)
        minor = call(driver.cuDeviceGetAttribute,
                     driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device)
        arch = f"{major}{minor}"
        ptx = compile_ptx(arch)
        module = call(driver.cuModuleLoadData, ptx)
        function = call(driver.cuModuleGetFunction, module, KERNEL_NAME.encode())
        global_pointer, global_bytes = call(driver.cuModuleGetGlobal, module, GLOBAL_NAME.encode())
        bias = np.array([0.5], dtype=np.float32)
        call(driver.cuMemcpyHtoD, global_pointer, bias.ctypes.data, bias.nbytes)
        pointer = call(driver.cuMemAlloc, ELEMENTS * 4)
        launches, elapsed_ms = launch_loop(function, pointer, args.seconds, max(1, args.sync_every))
        frees = [error_name(driver.cuMemFree, pointer)[0]]
        call(driver.cuModuleUnload, module)
        call(driver.cuDevicePrimaryCtxRelease, device)
    except (DriverError, CompileError) as error:
        fail(args.out, error)
        return 1
    write_result(args.out, {"arch": arch, "ptx_bytes": len(ptx), "entry": f".entry {KERNEL_NAME}".encode() in ptx,
                            "global_bytes": int(global_bytes), "launches": launches, "elapsed_ms": elapsed_ms,
                            "frees": frees})
    return 0


if __name__ == "__main__":
    sys.exit(main())
