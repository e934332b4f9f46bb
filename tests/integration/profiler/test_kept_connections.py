"""What the profiler's load relies on: fake-fn keeps a connection open when asked (and only then),
FAKE_FN_CONCURRENCY=1 runs one inference at a time however many requests are in flight, and the
client's kept connection sends a request once more when the server had closed it while idle."""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from fastgshare_cli.profile_command import HttpTarget, KeptConnection, local_fake_fn
from fastgshare_cli.sandbox import HookBuild, TenantSpec, build_hook


@pytest.fixture(scope="module")
def build() -> HookBuild:
    return build_hook(sys.executable)


def _read_answers(sock: socket.socket, count: int) -> list[bytes]:
    """``count`` answers (head + Content-Length body) from the socket, in order."""
    buffer, answers = b"", list[bytes]()
    while len(answers) < count:
        head_end = buffer.find(b"\r\n\r\n")
        if head_end >= 0:
            head = buffer[:head_end].decode("latin-1").lower()
            length = int(head.split("content-length:")[1].split("\r\n")[0])
            if len(buffer) >= head_end + 4 + length:
                answers.append(buffer[:head_end + 4 + length])
                buffer = buffer[head_end + 4 + length:]
                continue
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed after {len(answers)} answer(s)"
        buffer += chunk
    return answers


@pytest.fixture
def fake_fn(build: HookBuild) -> Iterator[int]:
    spec = TenantSpec(name="kept", request=1.0, limit=1.0, sm=50)
    with local_fake_fn(build, spec, gpu_ms=20, kernel_us=5000, inferences=1) as port:
        yield port


def test_fake_fn_keeps_a_connection_open_only_when_asked(fake_fn: int) -> None:
    with socket.create_connection(("127.0.0.1", fake_fn), timeout=20) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\na"
                     b"POST / HTTP/1.1\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\nb")
        first, second = _read_answers(sock, 2)
        assert b"Connection: keep-alive\r\n" in first
        assert b'"echo": "a"' in first
        assert b"Connection: keep-alive\r\n" in second
        assert b'"echo": "b"' in second
        sock.sendall(b"POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n")  # no keep-alive asked: the last answer
        (last,) = _read_answers(sock, 1)
        assert b"Connection: close\r\n" in last
        assert sock.recv(1) == b""


def test_one_inference_at_a_time_with_requests_in_parallel(fake_fn: int) -> None:
    walls: list[float] = []

    def one() -> None:
        with socket.create_connection(("127.0.0.1", fake_fn), timeout=20) as sock:
            sock.sendall(b"POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
            _read_answers(sock, 1)

    began = time.monotonic()
    threads = [threading.Thread(target=one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    walls.append(time.monotonic() - began)
    # four requests of 20 ms of GPU time each: at SM 50 two would fit on the fake GPU at once,
    # one at a time they take at least 80 ms
    assert walls[0] >= 0.079


def test_a_kept_connection_the_server_closed_is_reopened_once() -> None:
    answers = 0

    async def server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal answers
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(2)
        answers += 1
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok")
        await writer.drain()
        writer.close()  # says keep-alive, closes anyway: as a server's idle timeout does

    async def main() -> list[bool]:
        listener = await asyncio.start_server(server, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        target = HttpTarget(host="127.0.0.1", port=port)
        connection = KeptConnection(target)
        data = target.request_bytes(keep_alive=True)
        results = [await connection.request(data)]
        await asyncio.sleep(0.05)
        results.append(await connection.request(data))
        connection.close()
        listener.close()
        await listener.wait_closed()
        return results

    assert asyncio.run(main()) == [True, True]
    assert answers == 2
