"""A numba-cuda tenant on NVIDIA's binding (cuda-bindings): a device array round trip, a ``@cuda.jit``
kernel launched in a loop for ``--seconds`` (waiting for the device every ``--sync-every``
launches), then allocations of ``--chunk-mib`` until numba raises its out-of-memory error, held
``--hold-s`` seconds before the exit frees them. Run under the hook on the simulated GPU by
tests/nvidia/test_numba_cuda.py.

Writes one JSON object to ``--out``: ``binding`` (the module numba calls the driver through:
``cuda.bindings.driver``, NVIDIA's binding), ``roundtrip`` (whether ``to_device`` then
``copy_to_host`` gave the data back), ``launches``, ``allocated`` (chunks before the refusal) and
``refusal``: the exception's ``type`` (module and name), its ``code`` (the CUresult name) and
``message``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

os.environ.setdefault("NUMBA_CUDA_USE_NVIDIA_BINDING", "1")  # before numba reads its config

import numpy as np
from driver_calls import write_result
from numba import cuda
from numba.cuda.cudadrv import driver as numba_driver
from trace_calls import install_from_env

MIB = 1 << 20
ELEMENTS = 1 << 16


@cuda.jit
def bump(values: Any) -> None:
    i = cuda.grid(1)
    if i < values.size:
        values[i] += 1.0


def roundtrip() -> bool:
    host = np.arange(ELEMENTS, dtype=np.float32)
    return bool(np.array_equal(cuda.to_device(host).copy_to_host(), host))


def launch_loop(seconds: float, sync_every: int) -> int:
    values = cuda.to_device(np.zeros(ELEMENTS, dtype=np.float32))
    threads = 256
    blocks = (ELEMENTS + threads - 1) // threads
    launches, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        bump[blocks, threads](values)
        launches += 1
        if launches % sync_every == 0:
            cuda.synchronize()
    cuda.synchronize()
    return launches


def code_name(code: Any) -> str:
    return str(getattr(code, "name", code))


def allocate_until_refused(chunk: int, most: int, hold_s: float) -> tuple[int, dict[str, str] | None]:
    """Device arrays of ``chunk`` bytes until numba raises (at most ``most``), held ``hold_s`` more
    seconds (so a sampling meter sees them): (count, the refusal)."""
    arrays = []
    refusal = None
    for _ in range(most):
        try:
            arrays.append(cuda.device_array(chunk, dtype=np.uint8))
        except Exception as error:  # recorded whole: the test asserts the type and code
            kind = type(error)
            refusal = {"type": f"{kind.__module__}.{kind.__qualname__}",
                       "code": code_name(getattr(error, "code", None)), "message": str(error)}
            break
    time.sleep(hold_s)
    return len(arrays), refusal


def main() -> int:
    install_from_env()  # numba looks each driver function up when it calls it
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--sync-every", type=int, default=10)
    parser.add_argument("--chunk-mib", type=int, default=64)
    parser.add_argument("--most", type=int, default=64)
    parser.add_argument("--hold-s", type=float, default=0.5, help="how long to hold the arrays when full")
    args = parser.parse_args()
    try:
        result: dict[str, Any] = {"binding": numba_driver.binding.__name__}
        result["roundtrip"] = roundtrip()
        result["launches"] = launch_loop(args.seconds, max(1, args.sync_every))
        result["allocated"], result["refusal"] = allocate_until_refused(args.chunk_mib * MIB, args.most, args.hold_s)
    except Exception as error:  # reported whole in the result file: the test prints it
        write_result(args.out, {"error": f"{type(error).__module__}.{type(error).__qualname__}: {error}"})
        print(f"numba_loop: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
