"""The model store's worker: one process per GPU that holds functions' weights in GPU memory and
exports each allocation through CUDA IPC (``python -m device_plugin.models.worker --socket PATH``).

It owns: the GPU's CUDA context (ctypes on ``libcuda.so.1`` as the process's loader finds it: the
node agent points it at the simulated driver through ``LD_LIBRARY_PATH`` with the GPU's
``FASTGSHARE_FAKE_GPU_DIR``/``FASTGSHARE_FAKE_GPU_MEMORY``, or at one real GPU with
``CUDA_VISIBLE_DEVICES=<uuid>``), the allocations behind the handles it gave out, and the
agent -> worker protocol (:mod:`.protocol`) on a private unix socket (mode 0600, in a directory
only the agent's user may enter; never mounted into a container).

- ``load``: the file must be a regular file of exactly the declared size; it is read in chunks
  into one ``cuMemAlloc`` (``cuMemcpyHtoD``) and exported (``cuIpcGetMemHandle``). Idempotent: the
  same handle while the model is loaded.
- ``free``: the handle is forgotten first (a later ``load`` or ``list`` never shows it again), then
  ``cuMemFree``: on a real GPU the old handle would map whatever is allocated at the same address
  next (simgpu/README.md, "IPC memory").
- ``list``: its pid and what it holds (how a restarted agent adopts it).

It runs in a session of its own (the agent starts it so): a restart of the agent process leaves it
running, and the pods' mappings with it. It exits once it has held nothing for
``--idle-exit-seconds``, so its context goes away. One request a connection, lines of at most
4096 bytes, 5 s to send one; requests are served one at a time (the agent serializes them per GPU
anyway). A lock file next to the socket keeps a second worker off the same GPU.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import fcntl
import logging
import os
import socket
import stat
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import attrs

from device_plugin.models import protocol

log = logging.getLogger("device_plugin.models.worker")

CHUNK = 8 << 20  # bytes read and copied at a time: the worker's host memory stays small
LOCK_WAIT_S = 10.0  # a previous worker on the same socket may be exiting
ACCEPT_TICK_S = 0.5

CUDA_LIBRARY = "libcuda.so.1"


class CudaError(Exception):
    """A driver call failed; the message names the call and the CUresult."""


class IpcMemHandle(ctypes.Structure):
    """CUipcMemHandle: 64 opaque bytes."""

    _fields_ = [("reserved", ctypes.c_char * protocol.HANDLE_BYTES)]


class Cuda:
    """The few driver calls the worker makes, on device 0 of what the process sees, with its
    primary context current on the calling thread (the worker has one)."""

    def __init__(self, library: str = CUDA_LIBRARY) -> None:
        try:
            lib = ctypes.CDLL(library)
        except OSError as error:
            raise CudaError(f"cannot load {library}: {error} (on simulated GPUs the agent sets LD_LIBRARY_PATH to "
                            "the simulated driver's directory)") from None
        u64, size_t = ctypes.c_uint64, ctypes.c_size_t
        lib.cuInit.argtypes = [ctypes.c_uint]
        lib.cuDeviceGet.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        lib.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
        lib.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
        lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(u64), size_t]
        lib.cuMemcpyHtoD_v2.argtypes = [u64, ctypes.c_void_p, size_t]
        lib.cuMemFree_v2.argtypes = [u64]
        lib.cuIpcGetMemHandle.argtypes = [ctypes.POINTER(IpcMemHandle), u64]
        self._lib = lib
        self._check(lib.cuInit(0), "cuInit")
        device = ctypes.c_int()
        self._check(lib.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet(0)")
        context = ctypes.c_void_p()
        self._check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
        self._check(lib.cuCtxSetCurrent(context), "cuCtxSetCurrent")

    def alloc(self, size: int) -> int:
        pointer = ctypes.c_uint64()
        self._check(self._lib.cuMemAlloc_v2(ctypes.byref(pointer), size), f"cuMemAlloc of {size} bytes")
        return pointer.value

    def copy_in(self, pointer: int, buffer: ctypes.Array[ctypes.c_char], size: int) -> None:
        self._check(self._lib.cuMemcpyHtoD_v2(pointer, ctypes.addressof(buffer), size), "cuMemcpyHtoD")

    def export(self, pointer: int) -> str:
        handle = IpcMemHandle()
        self._check(self._lib.cuIpcGetMemHandle(ctypes.byref(handle), pointer), "cuIpcGetMemHandle")
        return ctypes.string_at(ctypes.addressof(handle), protocol.HANDLE_BYTES).hex()

    def free(self, pointer: int) -> None:
        self._check(self._lib.cuMemFree_v2(pointer), "cuMemFree")

    def _check(self, result: int, what: str) -> None:
        if result != 0:
            name = ctypes.c_char_p()
            getter = getattr(self._lib, "cuGetErrorName", None)
            if getter is not None and getter(result, ctypes.byref(name)) == 0 and name.value:
                raise CudaError(f"{what} failed: {name.value.decode(errors='replace')} ({result})")
            raise CudaError(f"{what} failed: CUresult {result}")


@attrs.define
class Held:
    identity: str
    key: str
    bytes: int
    pointer: int
    handle: str


class Holdings:
    """What the worker holds, by identity; its CUDA context is made on the first load."""

    def __init__(self, cuda_library: str = CUDA_LIBRARY) -> None:
        self._library = cuda_library
        self._cuda: Cuda | None = None
        self.models: dict[str, Held] = {}

    def answer(self, request: protocol.WorkerRequest) -> dict[str, object]:
        if isinstance(request, protocol.ListRequest):
            return {"ok": True, "pid": os.getpid(),
                    "models": [{"identity": h.identity, "key": h.key, "bytes": h.bytes, "handle": h.handle}
                               for h in self.models.values()]}
        if isinstance(request, protocol.FreeRequest):
            held = self.models.pop(request.identity, None)  # forgotten first: never handed out again
            if held is not None and self._cuda is not None:
                try:
                    self._cuda.free(held.pointer)
                except CudaError as error:  # the handle is gone either way
                    log.error("model=%s freed with an error: %s", held.key, error)
                log.info("model=%s freed bytes=%d", held.key, held.bytes)
            return {"ok": True}
        return self._load(request)

    def _load(self, request: protocol.LoadRequest) -> dict[str, object]:  # noqa: PLR0911 - one return per refusal
        held = self.models.get(request.identity)
        if held is not None:
            if held.bytes != request.bytes:
                return protocol.error(f"model {request.key} is loaded with {held.bytes} bytes, not {request.bytes}: "
                                      "one identity has one size")
            return {"ok": True, "handle": held.handle, "bytes": held.bytes}
        try:
            descriptor = os.open(request.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as error:
            reason = "does not exist" if error.errno == errno.ENOENT else f"cannot be opened ({error.strerror})"
            return protocol.error(f"model file {request.path} of {request.key} {reason}: put the weights there on "
                                  "this node (the node agent's --model-dir) or fix spec.model.source.path")
        try:
            info = os.fstat(descriptor)
            if not stat.S_ISREG(info.st_mode):
                return protocol.error(f"model file {request.path} of {request.key} is not a regular file: the "
                                      "weights must be one file")
            if info.st_size != request.bytes:
                return protocol.error(f"model file {request.path} of {request.key} has {info.st_size} bytes, the "
                                      f"model declares {request.bytes}: make spec.model.bytes the file's size")
            try:
                cuda = self._context()
                pointer = cuda.alloc(request.bytes)
            except CudaError as error:
                return protocol.error(f"cannot load model {request.key} ({request.bytes} bytes) on this GPU: {error}")
            try:
                handle = self._fill_and_export(cuda, descriptor, pointer, request)
            except (CudaError, OSError, ValueError) as error:
                cuda.free(pointer)
                return protocol.error(f"cannot load model {request.key} from {request.path}: {error}")
        finally:
            os.close(descriptor)
        self.models[request.identity] = Held(request.identity, request.key, request.bytes, pointer, handle)
        log.info("model=%s loaded bytes=%d from=%s", request.key, request.bytes, request.path)
        return {"ok": True, "handle": handle, "bytes": request.bytes}

    def _fill_and_export(self, cuda: Cuda, descriptor: int, pointer: int, request: protocol.LoadRequest) -> str:
        buffer = ctypes.create_string_buffer(min(CHUNK, request.bytes))
        view = memoryview(buffer).cast("B")
        done = 0
        while done < request.bytes:
            want = min(len(view), request.bytes - done)
            got = os.readv(descriptor, [view[:want]])
            if got == 0:
                raise ValueError(f"the file ended after {done} of {request.bytes} bytes (changed while loading?)")
            cuda.copy_in(pointer + done, buffer, got)
            done += got
        if os.read(descriptor, 1):
            raise ValueError(f"the file grew past {request.bytes} bytes while loading")
        return cuda.export(pointer)

    def _context(self) -> Cuda:
        if self._cuda is None:
            self._cuda = Cuda(self._library)
        return self._cuda


def serve_one(connection: socket.socket, holdings: Holdings) -> None:
    """Read one request line, answer it, close."""
    with connection:
        connection.settimeout(protocol.TIMEOUT_S)
        try:
            raw = read_line(connection)
            document = protocol.decode_line(raw)
            request = protocol.parse_worker_request(document)
        except (protocol.ProtocolError, OSError) as error:
            _send(connection, protocol.error(str(error)))
            return
        answer = holdings.answer(request)
        try:
            _send(connection, answer, protocol.LIST_LINE_LIMIT if isinstance(request, protocol.ListRequest) else None)
        except OSError as error:
            log.warning("could not answer the agent: %s", error)


def read_line(connection: socket.socket, limit: int = protocol.MAX_LINE) -> bytes:
    """One line of at most ``limit`` bytes (the connection's timeout applies to each read)."""
    data = bytearray()
    while not data.endswith(b"\n"):
        chunk = connection.recv(limit + 1 - len(data))
        if not chunk:
            if not data:
                raise protocol.ProtocolError("the connection closed before a request line")
            break
        data += chunk
        if len(data) > limit:
            raise protocol.ProtocolError(f"the line is longer than {limit} bytes; allowed: at most {limit}")
    return bytes(data)


def _send(connection: socket.socket, answer: Mapping[str, object], limit: int | None = None) -> None:
    connection.sendall(protocol.encode_line(answer, limit or protocol.MAX_LINE))


def take_lock(lock_path: Path, wait_s: float = LOCK_WAIT_S) -> int:
    """An exclusive lock on ``lock_path`` for the process's life; SystemExit if another worker keeps it."""
    descriptor = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return descriptor
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise SystemExit(f"model worker: another worker holds {lock_path}: it serves this GPU") from None
            time.sleep(0.1)


def serve(socket_path: Path, idle_exit_s: float, holdings: Holdings) -> None:
    """Serve until the worker has held nothing for ``idle_exit_s``."""
    take_lock(socket_path.with_name(socket_path.name + ".lock"))
    socket_path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_mask = os.umask(0o177)  # 0600 from the start: no moment when others may connect
    try:
        listener.bind(str(socket_path))
    finally:
        os.umask(old_mask)
    os.chmod(socket_path, 0o600)
    bound = socket_path.stat()
    listener.listen(16)
    listener.settimeout(ACCEPT_TICK_S)
    log.info("model worker serving socket=%s pid=%d idle_exit_s=%g", socket_path, os.getpid(), idle_exit_s)
    idle_since: float | None = time.monotonic()
    try:
        while True:
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                if idle_since is not None and time.monotonic() - idle_since >= idle_exit_s:
                    log.info("model worker exiting: it has held nothing for %gs", idle_exit_s)
                    return
                continue
            serve_one(connection, holdings)
            if holdings.models:
                idle_since = None
            elif idle_since is None:
                idle_since = time.monotonic()
    finally:
        try:  # remove the path only if it is still ours (a later worker may have bound it)
            now = socket_path.stat()
            if (now.st_dev, now.st_ino) == (bound.st_dev, bound.st_ino):
                socket_path.unlink()
        except OSError:
            pass
        listener.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m device_plugin.models.worker",
                                     description="The node's model store worker for one GPU (started by the node "
                                                 "agent): holds weights in GPU memory and exports them through "
                                                 "CUDA IPC.")
    parser.add_argument("--socket", type=Path, required=True, help="the private unix socket to serve")
    parser.add_argument("--idle-exit-seconds", type=float, default=30.0,
                        help="exit after holding nothing for this long (default: %(default)s)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    args = parser.parse_args(argv)
    if args.idle_exit_seconds < 0:
        parser.error(f"--idle-exit-seconds {args.idle_exit_seconds}: allowed: 0 or more seconds")
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    serve(args.socket, args.idle_exit_seconds, Holdings())
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
