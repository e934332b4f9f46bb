"""A cuda-bindings tenant: what NVIDIA's Python driver bindings see of a pod's memory limit and of the
device, run under the hook on the simulated GPU by tests/nvidia/test_cuda_bindings.py.

Writes one JSON object to ``--out``: ``bindings`` (cuda-bindings' version), ``info``
(cuMemGetInfo free/total before allocating), ``total_mem`` (cuDeviceTotalMem), ``attributes``
(every CUdevice_attribute member: its value, or the CUresult name it failed with), ``allocated``
(how many ``--chunk-mib`` allocations succeeded before the first failure) and ``refusal`` (that
failure's CUresult name), ``info_full`` (cuMemGetInfo when full), ``frees`` (the CUresult names of
the frees), ``info_after`` (after the frees). With ``--leave N`` it keeps N chunks allocated at
exit, for the exit to reclaim.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import cuda.bindings
from cuda.bindings import driver
from driver_calls import DriverError, call, error_name, fail, primary_context, write_result
from trace_calls import install_from_env

MIB = 1 << 20


def attributes(device: Any) -> dict[str, Any]:
    """Every attribute of the CUdevice_attribute table: its value, or the error it got."""
    answers: dict[str, Any] = {}
    for attribute in driver.CUdevice_attribute:
        if attribute.name.endswith("_MAX"):  # the table's end marker, not an attribute
            continue
        code, value = error_name(driver.cuDeviceGetAttribute, attribute, device)
        answers[attribute.name] = value if code == "CUDA_SUCCESS" else code
    return answers


def allocate_until_refused(chunk: int, most: int) -> tuple[list[Any], str | None]:
    """Allocations of ``chunk`` bytes until one fails (at most ``most``): the pointers, the refusal."""
    pointers: list[Any] = []
    for _ in range(most):
        code, pointer = error_name(driver.cuMemAlloc, chunk)
        if code != "CUDA_SUCCESS":
            return pointers, code
        pointers.append(pointer)
    return pointers, None


def main() -> int:
    install_from_env()
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--chunk-mib", type=int, default=64)
    parser.add_argument("--most", type=int, default=64, help="allocations to try at most")
    parser.add_argument("--leave", type=int, default=0, help="chunks left allocated at exit")
    args = parser.parse_args()
    try:
        device, _ = primary_context()
        free, total = call(driver.cuMemGetInfo)
        result: dict[str, Any] = {"bindings": cuda.bindings.__version__, "info": [int(free), int(total)],
                                  "total_mem": int(call(driver.cuDeviceTotalMem, device))}
        result["attributes"] = attributes(device)
        pointers, refusal = allocate_until_refused(args.chunk_mib * MIB, args.most)
        result |= {"allocated": len(pointers), "refusal": refusal,
                   "info_full": [int(v) for v in call(driver.cuMemGetInfo)]}
        kept = pointers[:args.leave]
        result["frees"] = [error_name(driver.cuMemFree, pointer)[0] for pointer in pointers[args.leave:]]
        result["info_after"] = [int(v) for v in call(driver.cuMemGetInfo)]
        result["left"] = len(kept)
        if not kept:
            call(driver.cuDevicePrimaryCtxRelease, device)
    except DriverError as error:
        fail(args.out, error)
        return 1
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
