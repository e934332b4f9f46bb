"""Running ``fake-fn`` (simgpu/workloads/fake_fn.c) as a real process on loopback, and raw HTTP to it.

The server prints ``{"event": "ready", "port": ...}`` once it listens (``FAKE_FN_PORT=0`` picks a free
port); :func:`start_fake_fn` waits for that line. :func:`raw_http` sends exact bytes and reads the
whole answer (the server always closes), so tests can send what no HTTP client library would.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import attrs
import pytest

from tests.integration.hook.fake_arbiter import FakeArbiter
from tests.integration.hook.tenants import SIMGPU_BUILD, Build, tenant_env

# FAKE_FN_BINARY runs the tests against another build, e.g. one with -fsanitize=address,undefined.
FAKE_FN = Path(os.environ.get("FAKE_FN_BINARY") or SIMGPU_BUILD / "fake-fn")


@attrs.frozen
class Answer:
    status: int
    headers: dict[str, str]  # names lowercased
    body: bytes

    def json(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.body)
        return data


@attrs.define
class FakeFn:
    process: subprocess.Popen[str]
    port: int
    ready: dict[str, Any]

    @property
    def pid(self) -> int:
        return self.process.pid

    def request(self, data: bytes, *, timeout_s: float = 20.0, head: bool = False) -> Answer:
        return raw_http(self.port, data, timeout_s=timeout_s, head=head)

    def stop(self, timeout_s: float = 20.0) -> tuple[int, str, str]:
        """SIGTERM, then the exit status, the rest of stdout and stderr."""
        if self.process.poll() is None:
            self.process.terminate()
        try:
            stdout, stderr = self.process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            stdout, stderr = self.process.communicate()
            pytest.fail(f"fake-fn did not stop within {timeout_s} s after SIGTERM; stderr:\n{stderr}")
        return self.process.returncode, stdout, stderr


def fake_fn_env(build: Build, gpu_dir: Path, *, hook: bool = True, arbiter: FakeArbiter | None = None,
                settings: dict[str, str] | None = None, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(base) if base is not None else tenant_env(build, gpu_dir, hook=hook, arbiter=arbiter)
    env.update({"FAKE_FN_PORT": "0", "FAKE_FN_HOST": "127.0.0.1"})
    env.update(settings or {})
    return env


def start_fake_fn(env: dict[str, str]) -> FakeFn:
    process = subprocess.Popen([str(FAKE_FN)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert process.stdout is not None
    line = process.stdout.readline()  # the ready line, or "" if it exited
    if not line:
        _, stderr = process.communicate(timeout=20)
        pytest.fail(f"fake-fn exited ({process.returncode}) before it was ready; stderr:\n{stderr}")
    ready: dict[str, Any] = json.loads(line)
    assert ready["event"] == "ready", line
    return FakeFn(process, int(ready["port"]), ready)


def parse_answer(raw: bytes, *, head: bool = False) -> Answer:
    """One answer to the end of the connection; its body must be Content-Length long (none for HEAD)."""
    top, sep, body = raw.partition(b"\r\n\r\n")
    assert sep, f"no complete answer: {raw!r}"
    lines = top.decode("latin-1").split("\r\n")
    version, status, _ = lines[0].split(" ", 2)
    assert version == "HTTP/1.1", lines[0]
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        assert len(body) == (0 if head else int(headers["content-length"])), (headers, body)
    return Answer(int(status), headers, body)


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def raw_http(port: int, data: bytes, *, timeout_s: float = 20.0, head: bool = False) -> Answer:
    """Send ``data``, half-close, read to EOF; the one answer (a 100 Continue before it is skipped)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        raw = read_all(sock)
    if raw.startswith(b"HTTP/1.1 100 "):
        raw = raw.split(b"\r\n\r\n", 1)[1]
    return parse_answer(raw, head=head)
