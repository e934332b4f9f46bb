"""A function's process calling the hook's model API from Python, for test_model_api.py.

Run under the hook (``LD_PRELOAD``) on the simulated driver (``LD_LIBRARY_PATH``), it finds
``fastgshare_model_open``, ``_close`` and ``_error`` with ``ctypes.CDLL(None)`` exactly as a Python
function would, reads one command a line on stdin (``{"op": ..., ...}``) and answers each with one
JSON line; it asserts nothing (the test does).
"""

from __future__ import annotations

import ctypes as C
import json
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

hook = C.CDLL(None)
hook.fastgshare_model_open.argtypes = [C.c_char_p, C.POINTER(C.c_uint64), C.POINTER(C.c_size_t)]
hook.fastgshare_model_close.argtypes = [C.c_uint64]
hook.fastgshare_model_error.restype = C.c_char_p
cuda = C.CDLL("libcuda.so.1")


def error() -> str:
    text: bytes = hook.fastgshare_model_error()
    return text.decode()


def init() -> dict[str, Any]:
    return {"result": cuda.cuInit(0)}


def context() -> dict[str, Any]:
    ctx = C.c_void_p()
    result = cuda.cuInit(0) or cuda.cuDevicePrimaryCtxRetain(C.byref(ctx), 0) or cuda.cuCtxSetCurrent(ctx)
    return {"result": result}


def open_model(name: str | None = None, null_ptr: bool = False) -> dict[str, Any]:
    ptr, size = C.c_uint64(), C.c_size_t()
    code = hook.fastgshare_model_open(None if name is None else name.encode(), None if null_ptr else C.byref(ptr),
                                      C.byref(size))
    return {"code": code, "ptr": ptr.value, "bytes": size.value, "error": error()}


def close_model(ptr: int) -> dict[str, Any]:
    code = hook.fastgshare_model_close(ptr)
    return {"code": code, "error": error()}


def read(ptr: int, offset: int, size: int) -> dict[str, Any]:
    out = C.create_string_buffer(size)
    result = cuda.cuMemcpyDtoH_v2(out, C.c_uint64(ptr + offset), C.c_size_t(size))
    return {"result": result, "data": out.raw.hex()}


def open_on_a_thread(name: str | None = None, null_ptr: bool = False) -> dict[str, Any]:
    """open_model on a thread of its own (its error is that thread's); then this thread's error."""
    answers: list[dict[str, Any]] = []
    thread = threading.Thread(target=lambda: answers.append(open_model(name, null_ptr)))
    thread.start()
    thread.join()
    return {"thread": answers[0], "error_here": error()}


def main() -> None:
    ops: dict[str, Callable[..., dict[str, Any]]] = {
        "init": init, "context": context, "open": open_model, "close": close_model, "read": read,
        "error": lambda: {"error": error()}, "open_on_a_thread": open_on_a_thread}
    print(json.dumps({"ready": True, "pid": os.getpid()}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        op = command.pop("op")
        if op == "exit":
            break
        print(json.dumps(ops[op](**command)), flush=True)


if __name__ == "__main__":
    main()
