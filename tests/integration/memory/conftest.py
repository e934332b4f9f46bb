"""End to end memory limits: tenants under the C hook, the REAL arbiter (``fastgshare-arbiter`` in
trusted-env mode, started by :mod:`fastgshare_cli.sandbox`), the fake GPU.

A tenant here is ``memcheck shell`` (vgpu_hook/tests/memcheck.c): it allocates, frees and asks
cuMemGetInfo on command and answers each command with one JSON line, so a test can drive several
processes of a pod step by step. :class:`LedgerProbe` reads the arbiter's pod ledger from outside
the tenants: it joins the pod as one more connection and sends a 0-byte MEM_RESERVE, whose reply
carries the pod's usage and limit.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fastgshare import keys, protocol
from fastgshare.protocol import MessageType
from fastgshare_cli.sandbox import GPU_UUID, HookBuild, Sandbox, SandboxError, TenantSpec, build_hook

MIB = 1 << 20
OOM = 2


@pytest.fixture(scope="session")
def hook_build() -> HookBuild:
    try:
        return build_hook()
    except SandboxError as error:
        pytest.fail(str(error))


def memcheck_path(build: HookBuild) -> Path:
    return build.hook.parent / "memcheck"


def hooked_env(build: HookBuild, box: Sandbox, spec: TenantSpec) -> dict[str, str]:
    """The environment of a process of the pod `spec` under the hook, on the sandbox's fake GPU."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("FASTGSHARE_") and k not in ("LD_PRELOAD", "LD_LIBRARY_PATH",
                                                            keys.ENV_MPS_THREAD_PERCENTAGE)}
    env.update({"LD_LIBRARY_PATH": str(build.fake_driver_dir), keys.ENV_FAKE_GPU_DIR: str(box.gpu_dir),
                keys.ENV_LD_PRELOAD: str(build.hook), keys.ENV_ARBITER_SOCKET: str(box.socket),
                keys.ENV_POD: spec.pod, keys.ENV_GPU_UUID: GPU_UUID})
    return env


class Tenant:
    """One ``memcheck shell`` process of a pod, under the hook, talking to the sandbox's arbiter."""

    def __init__(self, build: HookBuild, box: Sandbox, spec: TenantSpec) -> None:
        env = hooked_env(build, box, spec)
        self.process = subprocess.Popen([str(memcheck_path(build)), "shell"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        ready = self._reply()
        assert ready["op"] == "ready", ready
        self.pid = int(ready["pid"])

    def _reply(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            _, stderr = self.process.communicate(timeout=10)
            pytest.fail(f"memcheck shell exited ({self.process.returncode}): {stderr}")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def command(self, line: str) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        return self._reply()

    def alloc(self, size: int) -> dict[str, Any]:
        return self.command(f"alloc {size}")

    def quit(self) -> int:
        assert self.process.stdin is not None
        self.process.stdin.write("quit\n")
        self.process.stdin.close()
        return self.process.wait(timeout=10)

    def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


class LedgerProbe:
    """Reads the real arbiter's ledger of one pod (pod usage and limit) through the hook protocol."""

    def __init__(self, socket_path: Path, pod: str) -> None:
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._socket.settimeout(10)
        self._socket.connect(str(socket_path))
        self._reader = protocol.FrameReader()
        self._next_id = 1
        reply = self._request(MessageType.HELLO, protocol.Hello(os.getpid(), pod, GPU_UUID).encode())
        assert reply.type == MessageType.HELLO | protocol.REPLY_BIT, reply

    def _request(self, message_type: int, payload: bytes) -> protocol.Frame:
        request_id, self._next_id = self._next_id, self._next_id + 1
        self._socket.sendall(protocol.encode_frame(message_type, request_id, payload))
        while True:
            frames = self._reader.feed(self._socket.recv(4096))
            if frames:
                assert frames[0].request_id == request_id
                return frames[0]

    def read(self) -> protocol.MemReserveReply:
        frame = self._request(MessageType.MEM_RESERVE, protocol.encode_u64(0))
        return protocol.MemReserveReply.decode(frame.payload)

    @property
    def used(self) -> int:
        return self.read().pod_used_bytes

    def close(self) -> None:
        self._socket.close()


StartTenant = Callable[[Sandbox, TenantSpec], Tenant]
OpenProbe = Callable[[Sandbox, TenantSpec], LedgerProbe]


@pytest.fixture
def start_tenant(hook_build: HookBuild) -> Iterator[StartTenant]:
    """Starts ``memcheck shell`` tenants; they are killed after the test."""
    started: list[Tenant] = []

    def start(box: Sandbox, spec: TenantSpec) -> Tenant:
        tenant = Tenant(hook_build, box, spec)
        started.append(tenant)
        return tenant

    yield start
    for tenant in started:
        tenant.close()


@pytest.fixture
def open_probe() -> Iterator[OpenProbe]:
    """Opens ledger probes; they are closed after the test."""
    opened: list[LedgerProbe] = []

    def open_(box: Sandbox, spec: TenantSpec) -> LedgerProbe:
        probe = LedgerProbe(box.socket, spec.pod)
        opened.append(probe)
        return probe

    yield open_
    for probe in opened:
        probe.close()
