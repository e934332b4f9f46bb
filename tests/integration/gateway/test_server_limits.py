"""The gateway's own HTTP server under abuse: idle and slow-header connections neither block
``/healthz`` nor stay open past the idle timeout, and the connection cap evicts idle connections
before it refuses anyone."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import aiohttp

from fastgshare_gateway import http
from fastgshare_gateway.http import ServerLimits
from tests.integration.gateway.harness import gateway

IDLE, SLOW = 400, 40


@contextlib.asynccontextmanager
async def served(limits: ServerLimits) -> AsyncIterator[int]:
    async with gateway() as (gw, _):
        app = gw.app()  # a second app of the same handlers, on the server under test
        stop = asyncio.Event()
        bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(http.serve(app, "127.0.0.1", 0, stop, started=bound.set_result,
                                              shutdown_timeout_s=0.5, limits=limits))
        try:
            yield await asyncio.wait_for(bound, 10)
        finally:
            stop.set()
            await asyncio.wait_for(task, 20)


async def open_connections(port: int, count: int, first_bytes: bytes = b"") -> list[socket.socket]:
    sockets = []
    for _ in range(count):
        sock = socket.socket()
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        if first_bytes:
            await asyncio.get_running_loop().sock_sendall(sock, first_bytes)
        sockets.append(sock)
    return sockets


async def closed_by_server(sock: socket.socket, within_s: float) -> bool:
    try:
        data = await asyncio.wait_for(asyncio.get_running_loop().sock_recv(sock, 4096), within_s)
    except TimeoutError:
        return False
    except OSError:
        return True
    return data == b"" or data.startswith(b"HTTP/1.1 4")


async def healthz(port: int) -> int:
    timeout = aiohttp.ClientTimeout(total=5)  # generous: it answers in milliseconds when not blocked
    async with aiohttp.ClientSession(timeout=timeout) as client, \
            client.get(f"http://127.0.0.1:{port}/healthz") as answer:
        return answer.status


def test_idle_and_slow_header_connections_do_not_block_healthz_and_are_closed() -> None:
    async def scenario() -> None:
        async with served(ServerLimits(max_connections=1000, idle_timeout_s=1.0)) as port:
            idle = await open_connections(port, IDLE)
            slow = await open_connections(port, SLOW, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            try:
                for _ in range(5):
                    assert await healthz(port) == 200
                results = await asyncio.gather(*(closed_by_server(s, 15) for s in idle[:20] + slow[:20]))
                assert all(results), results.count(False)
            finally:
                for sock in idle + slow:
                    sock.close()
    asyncio.run(scenario())


def test_at_the_connection_cap_idle_connections_make_room() -> None:
    async def scenario() -> None:
        async with served(ServerLimits(max_connections=50, idle_timeout_s=60.0)) as port:
            held = await open_connections(port, 120, b"GET /healthz HTTP/1.1\r\nX-Slow: ")
            try:
                assert await healthz(port) == 200  # the oldest idle ones were closed to make room
                closed = await asyncio.gather(*(closed_by_server(s, 5) for s in held[:60]))
                assert all(closed), closed.count(False)
            finally:
                for sock in held:
                    sock.close()
    asyncio.run(scenario())
