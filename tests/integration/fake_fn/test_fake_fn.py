"""fake-fn, the function of the fastgshare/fake-fn:local image, as a real process on loopback.

It runs under the hook (LD_PRELOAD) on the fake GPU against a fake arbiter, so each test can see
that an inference's kernels were gated (the arbiter got TOKEN requests) and ran (the fake GPU's
state file counts them). Bad requests get one error answer and the server keeps serving.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from simgpu.state import read_state
from tests.integration.fake_fn.server import FAKE_FN, FakeFn, fake_fn_env, parse_answer, read_all, start_fake_fn
from tests.integration.hook.fake_arbiter import FakeArbiter
from tests.integration.hook.tenants import Build

RunFakeFn = Callable[..., FakeFn]


def post(server: FakeFn, path: str, body: bytes, timeout_s: float = 20.0) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return response.status, json.loads(response.read())


def assert_still_serving(server: FakeFn) -> None:
    status, answer = post(server, "/after", b"ok")
    assert status == 200
    assert answer["echo"] == "ok"


def test_a_request_runs_its_gpu_time_as_gated_kernels(run_fake_fn: RunFakeFn, arbiter: FakeArbiter,
                                                      gpu_dir: Path) -> None:
    server = run_fake_fn(FAKE_FN_GPU_MS="2.5", FAKE_FN_KERNEL_US="1000")
    assert server.ready["gpu_ms"] == 2.5
    assert server.ready["kernel_us"] == 1000
    status, answer = post(server, "/predict?model=x", b'{"x": 1}')
    assert status == 200
    assert answer["method"] == "POST"
    assert answer["path"] == "/predict"
    assert answer["gpu_ms"] == 2.5
    assert answer["kernels"] == 3
    assert answer["bytes"] == 8
    assert answer["echo"] == '{"x": 1}'
    assert answer["seq"] == 1
    assert answer["pod"]
    assert isinstance(answer["wall_ms"], float)
    assert answer["wall_ms"] > 0
    assert arbiter.hellos(), "the hook never said HELLO: fake-fn's launches were not gated"
    assert arbiter.token_requests(), "no TOKEN request reached the arbiter"
    assert read_state(gpu_dir).by_pid(server.pid).kernels == 3

    status, second = post(server, "/", b"")
    assert status == 200
    assert second["seq"] == 2
    assert second["bytes"] == 0
    assert second["echo"] == ""
    assert read_state(gpu_dir).by_pid(server.pid).kernels == 6


def test_any_method_and_the_pod_name_from_the_environment(build: Build, gpu_dir: Path, arbiter: FakeArbiter) -> None:
    server = start_fake_fn(fake_fn_env(build, gpu_dir, arbiter=arbiter,
                                       settings={"FASTGSHARE_POD": "fn/fake-fn-0", "FAKE_FN_GPU_MS": "0"}))
    try:
        answer = server.request(b"DELETE /x/y HTTP/1.1\r\nHost: a\r\n\r\n")
        assert answer.status == 200
        assert answer.headers["content-type"] == "application/json"
        assert answer.headers["connection"] == "close"
        data = answer.json()
        assert data["pod"] == "fn/fake-fn-0"
        assert data["method"] == "DELETE"
        assert data["path"] == "/x/y"
        assert data["kernels"] == 0  # FAKE_FN_GPU_MS=0: no GPU work at all
        head = server.request(b"HEAD / HTTP/1.0\r\n\r\n", head=True)
        assert head.status == 200
        assert head.body == b""
        assert int(head.headers["content-length"]) > 0
    finally:
        server.stop()


def test_health_launches_nothing(run_fake_fn: RunFakeFn, arbiter: FakeArbiter) -> None:
    server = run_fake_fn()
    answer = server.request(b"GET /_/health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (answer.status, answer.body) == (200, b"OK")
    assert server.request(b"GET /_/health?probe=1 HTTP/1.1\r\n\r\n").status == 200
    assert not arbiter.token_requests()


def test_binary_body_is_counted_and_escaped(run_fake_fn: RunFakeFn) -> None:
    server = run_fake_fn(FAKE_FN_ECHO_MAX="4")
    status, answer = post(server, "/", b'\x00"\\\xffrest')
    assert status == 200
    assert answer["bytes"] == 8
    assert answer["echo"] == '\x00"\\\xff'  # JSON escapes, first 4 bytes only


def test_chunked_body_and_expect_continue(run_fake_fn: RunFakeFn) -> None:
    server = run_fake_fn()
    chunked = server.request(b"POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                             b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n")
    assert chunked.status == 200
    assert chunked.json()["echo"] == "hello world"

    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as sock:
        sock.sendall(b"PUT /e HTTP/1.1\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n")
        interim = b""
        while not interim.endswith(b"\r\n\r\n"):
            interim += sock.recv(1)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(b"abc")
        answer = parse_answer(read_all(sock))
    assert answer.status == 200
    assert answer.json()["echo"] == "abc"


@pytest.mark.parametrize(("request_bytes", "status", "says"), [
    (b"garbage\r\n\r\n", 400, b"bad request line"),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 400, b"bad request line"),  # TLS hello
    (b"GET / HTTP/2.0\r\n\r\n", 400, b"HTTP/1.0 and HTTP/1.1"),
    (b"GET  / HTTP/1.1\r\n\r\n", 400, b"bad request line"),
    (b"GET /\x7f HTTP/1.1\r\n\r\n", 400, b"invalid target"),
    (b"GET / HTTP/1.1\r\nNo-Colon\r\n\r\n", 400, b"bad header line"),
    (b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n", 400, b"bad header name"),
    (b"GET / HTTP/1.1\r\nA: b\r\n folded\r\n\r\n", 400, b"bad header"),
    (b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400, b"Content-Length"),
    (b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", 400, b"Content-Length"),
    (b"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n", 413, b"too large"),
    (b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nshort", 400, b"ended early"),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501, b"only chunked"),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", 400, b"send one"),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400, b"bad chunk size"),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n", 400, b"longer than its size"),
    (b"POST / HTTP/1.1\r\nExpect: magic\r\n\r\n", 417, b"100-continue"),
])
def test_bad_requests_get_one_error_answer(run_fake_fn: RunFakeFn, arbiter: FakeArbiter, request_bytes: bytes,
                                           status: int, says: bytes) -> None:
    server = run_fake_fn()
    answer = server.request(request_bytes)
    assert answer.status == status, answer
    assert says in answer.body, answer
    assert answer.headers["content-type"].startswith("text/plain")
    assert not arbiter.token_requests(), "a bad request must not run an inference"
    assert_still_serving(server)


def test_oversized_headers_and_body(run_fake_fn: RunFakeFn) -> None:
    server = run_fake_fn(FAKE_FN_MAX_HEADER="1024", FAKE_FN_MAX_BODY="100")
    huge = server.request(b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 5000 + b"\r\n\r\n")
    assert huge.status == 431
    assert b"FAKE_FN_MAX_HEADER" in huge.body
    endless = server.request(b"GET /" + b"a" * 5000)  # no line end at all
    assert endless.status == 431
    big_body = server.request(b"POST / HTTP/1.1\r\nContent-Length: 101\r\n\r\n" + b"b" * 101)
    assert big_body.status == 413
    assert b"FAKE_FN_MAX_BODY" in big_body.body
    big_chunks = server.request(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                                + b"40\r\n" + b"c" * 64 + b"\r\n" + b"40\r\n" + b"c" * 64 + b"\r\n0\r\n\r\n")
    assert big_chunks.status == 413
    fits = server.request(b"POST / HTTP/1.1\r\nContent-Length: 100\r\n\r\n" + b"d" * 100)
    assert fits.status == 200
    assert fits.json()["bytes"] == 100


def test_a_slow_client_gets_408_and_does_not_block_others(run_fake_fn: RunFakeFn) -> None:
    server = run_fake_fn(FAKE_FN_READ_TIMEOUT_MS="1500")
    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as slow:
        slow.sendall(b"POST /slow HTTP/1.1\r\nContent-Le")  # and then nothing
        assert_still_serving(server)  # served on its own connection while the slow one waits
        answer = parse_answer(read_all(slow))
    assert answer.status == 408
    assert b"FAKE_FN_READ_TIMEOUT_MS" in answer.body

    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as idle:
        assert read_all(idle).startswith(b"HTTP/1.1 408 ")  # connected, sent nothing


def test_a_connection_closed_without_a_request_is_ignored(run_fake_fn: RunFakeFn) -> None:
    server = run_fake_fn()
    for _ in range(3):
        socket.create_connection(("127.0.0.1", server.port), timeout=20).close()
    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nContent-Length: 100\r\n\r\nabc")
        sock.close()  # the client goes away mid-body
    assert_still_serving(server)


def test_too_many_connections_get_503(run_fake_fn: RunFakeFn) -> None:
    server = run_fake_fn(FAKE_FN_MAX_CONNECTIONS="1", FAKE_FN_READ_TIMEOUT_MS="60000")
    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as holder:
        holder.sendall(b"GET / HTTP/1.1\r\n")  # holds the only connection slot
        status = 0
        for _ in range(50):  # the holder's thread may not have started when the first one arrives
            status = server.request(b"GET / HTTP/1.1\r\n\r\n").status
            if status == 503:
                break
        assert status == 503
        holder.sendall(b"\r\n")
        assert parse_answer(read_all(holder)).status == 200


def test_concurrent_requests_are_all_answered(run_fake_fn: RunFakeFn, gpu_dir: Path) -> None:
    server = run_fake_fn(FAKE_FN_GPU_MS="2")
    results: list[int] = []

    def client() -> None:
        for _ in range(5):
            results.append(post(server, "/", b"x")[1]["kernels"])  # type: ignore[arg-type]

    threads = [threading.Thread(target=client) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert results == [2] * 20
    assert read_state(gpu_dir).by_pid(server.pid).kernels == 40


def test_sigterm_stops_it_cleanly(run_fake_fn: RunFakeFn) -> None:
    server = run_fake_fn()
    post(server, "/", b"")
    returncode, stdout, _ = server.stop()
    assert returncode == 0
    assert json.loads(stdout.strip().splitlines()[-1]) == {"event": "stopped", "requests": 1}


@pytest.mark.parametrize(("name", "value", "allowed"), [
    ("FAKE_FN_GPU_MS", "fast", "0..60000"),
    ("FAKE_FN_GPU_MS", "-1", "0..60000"),
    ("FAKE_FN_GPU_MS", "nan", "0..60000"),
    ("FAKE_FN_KERNEL_US", "0", "1..1000000"),
    ("FAKE_FN_PORT", "70000", "0..65535"),
    ("FAKE_FN_HOST", "localhost", "IPv4 address"),
    ("FAKE_FN_MAX_CONNECTIONS", "1e3", "1..4096"),
    ("FAKE_FN_MEMORY", "1GB", "Ki, Mi, Gi"),
    ("FAKE_FN_LOAD_MS", "3s", "0..600000"),
])
def test_a_bad_setting_is_one_line_and_exit_64(build: Build, gpu_dir: Path, name: str, value: str,
                                              allowed: str) -> None:
    env = fake_fn_env(build, gpu_dir, hook=False, settings={name: value})
    result = subprocess.run([str(FAKE_FN)], env=env, capture_output=True, text=True, timeout=20, check=False)
    assert result.returncode == 64
    assert result.stderr.count("\n") == 1
    assert f"{name}={value}" in result.stderr
    assert allowed in result.stderr
    assert result.stdout == ""


def test_memory_at_start_is_charged_and_a_refusal_stops_it(build: Build, gpu_dir: Path, arbiter: FakeArbiter) -> None:
    server = start_fake_fn(fake_fn_env(build, gpu_dir, arbiter=arbiter, settings={"FAKE_FN_MEMORY": "64Mi"}))
    try:
        assert arbiter.memory_used == 64 << 20
    finally:
        server.stop()
    env = fake_fn_env(build, gpu_dir, arbiter=arbiter, settings={"FAKE_FN_MEMORY": "16Gi"})  # limit: 8 GiB
    result = subprocess.run([str(FAKE_FN)], env=env, capture_output=True, text=True, timeout=20, check=False)
    assert result.returncode == 1
    assert "cuMemAlloc" in result.stderr
    assert "OUT_OF_MEMORY" in result.stderr


def test_a_model_load_delays_listening_after_the_memory_is_held(build: Build, gpu_dir: Path,
                                                                arbiter: FakeArbiter) -> None:
    started = time.monotonic()
    server = start_fake_fn(fake_fn_env(build, gpu_dir, arbiter=arbiter,
                                       settings={"FAKE_FN_MEMORY": "64Mi", "FAKE_FN_LOAD_MS": "1500"}))
    try:
        assert time.monotonic() - started >= 1.5  # a lower bound: the ready line comes after the load
        assert arbiter.memory_used == 64 << 20
        assert_still_serving(server)
    finally:
        server.stop()


def test_mangled_requests_never_stop_it(run_fake_fn: RunFakeFn) -> None:
    """Good requests cut short, with bytes flipped or repeated: every answer is a status line or nothing."""
    server = run_fake_fn(FAKE_FN_GPU_MS="0", FAKE_FN_READ_TIMEOUT_MS="300", FAKE_FN_MAX_HEADER="512",
                         FAKE_FN_MAX_BODY="64")
    seeds = [b"POST /a?b=c HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\nhello",
             b"PUT / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3;x\r\nabc\r\n0\r\nT: 1\r\n\r\n"]
    generator = random.Random(16)
    for _ in range(150):
        data = bytearray(generator.choice(seeds))
        for _ in range(generator.randint(1, 4)):
            where = generator.randrange(len(data) + 1)
            kind = generator.randrange(4)
            if kind == 0 and where < len(data):
                data[where] = generator.randrange(256)
            elif kind == 1:
                del data[where:]
            elif kind == 2:
                data[where:where] = data[where:where + generator.randint(1, 40)] * generator.randint(1, 30)
            else:
                data[where:where] = generator.choice([b"\r\n", b"\n", b"\x00", b" ", b":", b"\r\n\r\n", b"ff\r\n"])
        with socket.create_connection(("127.0.0.1", server.port), timeout=20) as sock:
            with contextlib.suppress(ConnectionResetError, BrokenPipeError):
                sock.sendall(bytes(data))
                sock.shutdown(socket.SHUT_WR)
            try:
                raw = read_all(sock)
            except ConnectionResetError:
                raw = b""
        if raw.startswith(b"HTTP/1.1 100 "):
            raw = raw.split(b"\r\n\r\n", 1)[1]
        assert raw == b"" or re.match(rb"HTTP/1\.1 (200|400|408|413|417|431|501) ", raw), (bytes(data), raw)
    assert server.process.poll() is None
    assert_still_serving(server)
