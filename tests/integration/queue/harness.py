"""Processes for the queue tests: a real ``nats-server -js`` (Debian's package), the gateway
(:mod:`.gateway_process`) and the queue worker (``python -m fastgshare_queue.main``), each started on free
ports and killed on the way out, failures included; and in-process aiohttp stand-ins for a function and a
callback receiver that record what they saw."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from tests.integration.gateway.harness import serving  # noqa: F401 - re-exported for the queue tests

ROOT = Path(__file__).resolve().parents[3]
NATS_SERVER = shutil.which("nats-server") or next(
    (path for path in ("/usr/sbin/nats-server", "/usr/bin/nats-server") if Path(path).exists()), None)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def need_nats() -> str:
    """The nats-server binary; without it the test is skipped, or fails where every tier is
    required (``FASTGSHARE_REQUIRE_CLUSTER=1``, as CI sets it)."""
    if NATS_SERVER is None:
        message = "nats-server is not installed (Debian: apt-get install nats-server)"
        if os.environ.get("FASTGSHARE_REQUIRE_CLUSTER") == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return NATS_SERVER


def _kill(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait(timeout=10)


@contextlib.contextmanager
def nats_server() -> Iterator[str]:
    """``nats-server -js`` on a free loopback port, its store in a temporary directory; yields its URL. Killed
    and the directory removed on the way out."""
    binary = need_nats()
    store = tempfile.mkdtemp(prefix="fastgshare-nats-")
    port = free_port()
    log = open(Path(store) / "nats.log", "wb")  # noqa: SIM115 -- closed below
    process = subprocess.Popen([binary, "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", store],
                               stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(200):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
            if process.poll() is not None:
                raise RuntimeError(f"nats-server exited: {(Path(store) / 'nats.log').read_text()[-2000:]}")
            time.sleep(0.05)
        else:
            raise RuntimeError("nats-server did not listen within 10 s")
        yield f"nats://127.0.0.1:{port}"
    finally:
        _kill(process)
        log.close()
        shutil.rmtree(store, ignore_errors=True)


class Processes:
    """Child processes, all killed (SIGKILL) on :meth:`close`."""

    def __init__(self) -> None:
        self.all: list[asyncio.subprocess.Process] = []
        self.logs = Path(tempfile.mkdtemp(prefix="fastgshare-queue-logs-"))

    async def start(self, name: str, *args: str) -> asyncio.subprocess.Process:
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 -- the child holds it
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        process = await asyncio.create_subprocess_exec(sys.executable, *args, cwd=ROOT, env=env,
                                                       stdout=asyncio.subprocess.PIPE, stderr=log)
        log.close()
        self.all.append(process)
        return process

    async def gateway(self, nats_url: str, stream: str,
                      functions: dict[str, str]) -> tuple[asyncio.subprocess.Process, str]:
        args = ["-m", "tests.integration.queue.gateway_process", "--nats-url", nats_url, "--stream", stream]
        for name, address in functions.items():
            args += ["--function", f"{name}={address}"]
        process = await self.start("gateway", *args)
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 60)
        if not line.startswith(b"PORT "):
            raise RuntimeError(f"the gateway did not start: {line!r}; see {self.logs}/gateway.log:\n"
                               f"{(self.logs / 'gateway.log').read_text()[-3000:]}")
        return process, f"http://127.0.0.1:{int(line.split()[1])}"

    async def worker(self, nats_url: str, stream: str, gateway_url: str, listen_port: int,
                     *flags: str) -> asyncio.subprocess.Process:
        return await self.start("worker", "-m", "fastgshare_queue.main", "--nats-url", nats_url, "--async-stream",
                                stream, "--gateway-url", gateway_url, "--listen", f"127.0.0.1:{listen_port}", *flags)

    @staticmethod
    async def sigkill(process: asyncio.subprocess.Process) -> None:
        if process.returncode is None:
            process.send_signal(signal.SIGKILL)
        await process.wait()

    async def close(self) -> None:
        for process in self.all:
            with contextlib.suppress(ProcessLookupError):
                await self.sigkill(process)
        shutil.rmtree(self.logs, ignore_errors=True)

    def tail(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""


class FakeFunction:
    """A function pod: counts calls per ``X-Call-Id`` and path. ``/`` answers 200 after ``delay_s``; ``/flaky``
    answers 429, then 500, then 200 for each call id; ``/broken`` always 500."""

    def __init__(self, delay_s: float = 0.2) -> None:
        self.delay_s = delay_s
        self.calls: collections.Counter[str] = collections.Counter()
        self.seen = asyncio.Event()

    def app(self) -> web.Application:
        async def handler(request: web.Request) -> web.Response:
            call_id = request.headers.get("X-Call-Id", "")
            self.calls[call_id] += 1
            self.seen.set()
            body = await request.read()
            if request.path == "/flaky":
                status = {1: 429, 2: 500}.get(self.calls[call_id], 200)
                return web.Response(status=status, text=f"flaky try {self.calls[call_id]}\n")
            if request.path == "/broken":
                return web.Response(status=500, text="broken\n")
            await asyncio.sleep(self.delay_s)
            return web.Response(text=f"done {call_id} {len(body)} bytes\n", headers={"X-Answer": "yes"})
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handler)
        return app


class CallbackReceiver:
    def __init__(self) -> None:
        self.received: dict[str, list[tuple[dict[str, str], bytes]]] = collections.defaultdict(list)
        self.changed = asyncio.Event()

    def app(self) -> web.Application:
        async def handler(request: web.Request) -> web.Response:
            body = await request.read()
            self.received[request.headers.get("X-Call-Id", "")].append((dict(request.headers), body))
            self.changed.set()
            return web.Response(status=202)
        app = web.Application()
        app.router.add_post("/done", handler)
        return app

    async def wait_for(self, call_ids: set[str], deadline_s: float) -> None:
        """Until every call id has a callback (or ``deadline_s`` passes: the caller's assertion then fails)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline_s
        while not call_ids <= set(self.received) and loop.time() < end:
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), max(0.0, end - loop.time()))
