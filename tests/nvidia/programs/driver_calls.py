"""What the tier's cuda-bindings programs share: calling a driver entry point through NVIDIA's
bindings and turning its CUresult into a value or a :class:`DriverError`, and writing the program's
one JSON result. Imported as a sibling module by the scripts next to it (they run as scripts)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cuda.bindings import driver


class DriverError(RuntimeError):
    """A driver call returned an error: ``name`` is the call, ``code`` the CUresult's name."""

    def __init__(self, name: str, code: str) -> None:
        super().__init__(f"{name} returned {code}")
        self.name, self.code = name, code


def call(function: Callable[..., tuple[Any, ...]], *args: Any) -> Any:
    """``function(*args)`` through cuda-bindings: its value (None, one value or a tuple), or raises."""
    result = function(*args)
    error, values = result[0], result[1:]
    if error != driver.CUresult.CUDA_SUCCESS:
        raise DriverError(function.__name__, error.name)
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def error_name(function: Callable[..., tuple[Any, ...]], *args: Any) -> tuple[str, Any]:
    """``function(*args)``'s CUresult name and its first value (None on error), without raising."""
    result = function(*args)
    return result[0].name, result[1] if len(result) > 1 and result[0] == driver.CUresult.CUDA_SUCCESS else None


def primary_context() -> tuple[Any, Any]:
    """cuInit, device 0 and its primary context, made current: (device, context)."""
    call(driver.cuInit, 0)
    device = call(driver.cuDeviceGet, 0)
    context = call(driver.cuDevicePrimaryCtxRetain, device)
    call(driver.cuCtxSetCurrent, context)
    return device, context


def write_result(path: str, result: dict[str, Any]) -> None:
    """The program's result, with its pid, as one JSON object in ``path`` (written whole, then renamed)."""
    target = Path(path)
    temporary = target.with_name(f".{target.name}.tmp")
    temporary.write_text(json.dumps({"pid": os.getpid(), **result}))
    temporary.replace(target)


def fail(path: str, error: BaseException) -> None:
    """Record what failed in the result file and on stderr; the caller exits non-zero."""
    write_result(path, {"error": f"{type(error).__name__}: {error}"})
    print(f"{Path(sys.argv[0]).name}: {type(error).__name__}: {error}", file=sys.stderr)
