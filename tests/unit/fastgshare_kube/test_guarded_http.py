"""The pod-network HTTP server: deadlines, the connection cap, refusals, keep-alive (issue 37 item 5)."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest

from fastgshare_kube.guarded_http import GuardedHttpServer, Limits


def echo(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    body = environ["wsgi.input"].read()
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [environ["PATH_INFO"].encode() + b":" + body]


@pytest.fixture
def serve() -> Iterator[Callable[..., GuardedHttpServer]]:
    servers: list[GuardedHttpServer] = []

    def start(**limits: Any) -> GuardedHttpServer:
        server = GuardedHttpServer(echo, "127.0.0.1", 0, name="test", limits=Limits(**limits))
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def connect(server: GuardedHttpServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=5)


def read_all(sock: socket.socket) -> bytes:
    data = b""
    with contextlib.suppress(OSError):
        while chunk := sock.recv(65536):
            data += chunk
    return data


def seconds_until_closed(sock: socket.socket) -> float:
    started = time.monotonic()
    read_all(sock)
    return time.monotonic() - started


def test_kept_alive_and_pipelined_requests_are_answered_in_order(serve: Callable[..., GuardedHttpServer]) -> None:
    with connect(serve()) as sock:
        sock.sendall(b"POST /a HTTP/1.1\r\nContent-Length: 2\r\n\r\nhiGET /b HTTP/1.1\r\n\r\n"
                     b"GET /c HTTP/1.1\r\nConnection: close\r\n\r\n")
        answers = read_all(sock)
    assert answers.count(b"HTTP/1.1 200 OK") == 3
    assert answers.index(b"/a:hi") < answers.index(b"/b:") < answers.index(b"/c:")


@pytest.mark.parametrize(("sent", "status"), [
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", b"411"),
    (b"POST / HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n", b"413"),
    (b"GET / HTTP/1.1\r\nX-A: " + b"a" * 20_000 + b"\r\n\r\n", b"431"),
    (b"GET /\r\n\r\n", b"400"),
    (b"GET / HTTP/2.0\r\n\r\n", b"505"),
])
def test_requests_it_does_not_serve_get_a_status_and_the_connection_closes(
        serve: Callable[..., GuardedHttpServer], sent: bytes, status: bytes) -> None:
    with connect(serve(max_head_bytes=16 * 1024, max_body_bytes=1024)) as sock:
        sock.sendall(sent)
        assert read_all(sock).startswith(b"HTTP/1.1 " + status)


@pytest.mark.parametrize("phase", ["idle", "head", "body"])
def test_idle_and_trickling_connections_are_closed_at_their_deadline(
        serve: Callable[..., GuardedHttpServer], phase: str) -> None:
    server = serve(idle_timeout_s=0.5, header_timeout_s=0.5, body_timeout_s=0.5)
    with connect(server) as sock:
        if phase == "head":
            sock.sendall(b"GET / HTTP/1.1\r\n")
        elif phase == "body":
            sock.sendall(b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc")
        assert seconds_until_closed(sock) < 3
    assert server.connections == 0


def test_at_the_cap_the_longest_waiting_connection_makes_room(serve: Callable[..., GuardedHttpServer]) -> None:
    server = serve(max_connections=4)
    idle = [connect(server) for _ in range(4)]
    time.sleep(0.2)
    with connect(server) as fresh:
        fresh.sendall(b"GET /x HTTP/1.1\r\nConnection: close\r\n\r\n")
        assert b"/x:" in read_all(fresh)
    assert idle[0].recv(1) == b""  # the oldest was closed to make room
    assert server.connections <= 4
    for sock in idle:
        sock.close()
