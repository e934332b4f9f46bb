"""A test-only model store: the node agent's model sharing reduced to what a pod sees.

:class:`Exporter` is a real process on the simulated ``libcuda.so.1`` (ctypes, no hook, as the node
agent's per-GPU worker runs) that copies a file's bytes to the simulated GPU and exports them with
``cuIpcGetMemHandle``; it holds them until its stdin closes. :class:`ModelServer` answers the pod ->
agent protocol of issue 40 on a unix socket (one JSON line each way, one request per connection):
``{"op": "open", "model": name}`` -> the exporter's handle, or whatever answer the test scripted. It
records each request; it does not identify the caller (the real agent does, by SO_PEERCRED).

Run as a script (``python model_store.py <file>``) it is the exporter.
"""

from __future__ import annotations

import contextlib
import ctypes as C
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from simgpu.fake_fn import fnv1a64, window

HANDLE_SIZE = 64  # CU_IPC_HANDLE_SIZE
ACCEPT_POLL_S = 0.1
CONNECTION_TIMEOUT_S = 5.0
MAX_LINE = 4096


def expected_model(weights: bytes, name: str, seq: int) -> dict[str, Any]:
    """The ``model`` object of fake-fn's answer ``seq`` for these weights."""
    offset, length = window(len(weights), seq)
    return {"name": name, "bytes": len(weights), "offset": offset, "length": length,
            "fnv1a64": fnv1a64(weights[offset:offset + length])}


class Exporter:
    """One exporter process holding ``path``'s bytes on the simulated GPU in ``gpu_dir``."""

    def __init__(self, driver: Path, gpu_dir: Path, path: Path) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "LD_LIBRARY_PATH")}
        env.update({"SIMGPU_DRIVER": str(driver), "FASTGSHARE_FAKE_GPU_DIR": str(gpu_dir)})
        self.process = subprocess.Popen([sys.executable, __file__, str(path)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self.process.kill()
            _, stderr = self.process.communicate(timeout=30)
            raise AssertionError(f"the exporter exited ({self.process.returncode}): {stderr}")
        ready = json.loads(line)
        self.pid: int = ready["pid"]
        self.handle: str = ready["handle"]
        self.bytes: int = ready["bytes"]

    def stop(self) -> None:
        """Closes its stdin (it frees and exits), killing it if it does not go within 30 s."""
        if self.process.poll() is None:
            try:
                self.process.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.communicate()


class ModelServer:
    """The pod-facing model socket at ``path``. ``answer``: the line to send (a dict, written as JSON,
    or raw text); None: the exporter's handle, bytes and ``model_key``."""

    def __init__(self, path: Path, exporter: Exporter | None, model_key: str = "default/fn/weights",
                 answer: dict[str, Any] | str | None = None) -> None:
        self.path = path
        self.exporter = exporter
        self.model_key = model_key
        self.answer = answer
        self._requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        self._listener.listen(16)
        self._listener.settimeout(ACCEPT_POLL_S)
        self._thread = threading.Thread(target=self._accept_loop, name="model-server", daemon=True)
        self._thread.start()

    @property
    def requests(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._requests)

    def close(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=10)
        self._listener.close()
        self.path.unlink(missing_ok=True)

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(CONNECTION_TIMEOUT_S)
                with contextlib.suppress(OSError):  # the client went away: nothing to answer
                    self._serve(conn)

    def _serve(self, conn: socket.socket) -> None:
        data = b""
        while b"\n" not in data and len(data) <= MAX_LINE:
            chunk = conn.recv(MAX_LINE + 1)
            if not chunk:
                return
            data += chunk
        line = data.split(b"\n", 1)[0]
        try:
            request = json.loads(line)
        except ValueError:
            request = {"unparsed": line.decode("latin-1")}
        with self._lock:
            self._requests.append(request)
        reply: dict[str, Any] | str
        if self.answer is not None:
            reply = self.answer
        elif self.exporter is None:
            reply = {"ok": False, "error": "this test's store holds no model"}
        else:
            reply = {"ok": True, "handle": self.exporter.handle, "bytes": self.exporter.bytes,
                     "model": self.model_key}
        text = reply if isinstance(reply, str) else json.dumps(reply) + "\n"
        conn.sendall(text.encode())


# --- the exporter process --------------------------------------------------------------------------

def _export(path: Path) -> None:
    lib = C.CDLL(os.environ["SIMGPU_DRIVER"])

    def need(result: int, what: str) -> None:
        if result != 0:
            raise SystemExit(f"model_store exporter: {what} returned CUresult {result}")

    data = path.read_bytes()
    need(lib.cuInit(0), "cuInit")
    ctx = C.c_void_p()
    need(lib.cuDevicePrimaryCtxRetain(C.byref(ctx), 0), "cuDevicePrimaryCtxRetain")
    need(lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    ptr = C.c_uint64()
    need(lib.cuMemAlloc_v2(C.byref(ptr), C.c_size_t(len(data))), "cuMemAlloc_v2")
    need(lib.cuMemcpyHtoD_v2(ptr, data, C.c_size_t(len(data))), "cuMemcpyHtoD_v2")
    handle = C.create_string_buffer(HANDLE_SIZE)
    need(lib.cuIpcGetMemHandle(handle, ptr), "cuIpcGetMemHandle")
    print(json.dumps({"pid": os.getpid(), "handle": handle.raw.hex(), "bytes": len(data)}), flush=True)
    sys.stdin.read()  # held until the test closes stdin
    need(lib.cuMemFree_v2(ptr), "cuMemFree_v2")


if __name__ == "__main__":
    _export(Path(sys.argv[1]))
