"""The queue worker's listener (aiohttp): ``/healthz`` and ``/metrics``, nothing else.

Capped: request bodies 1 KiB, header lines and fields 8 KiB, 100 header fields, ``idle_timeout_s`` to a
request's headers (new or kept-alive connections), at most ``max_connections`` connections (past it a new
one is closed at once).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import attrs
from aiohttp import web

log = logging.getLogger(__name__)


class _Refused(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


@attrs.frozen
class Pages:
    healthy: Callable[[], bool]
    metrics: Callable[[], bytes]
    content_type: str


async def serve(pages: Pages, host: str, port: int, stop: asyncio.Event, *,
                started: Callable[[int], None] | None = None, max_connections: int = 64,
                idle_timeout_s: float = 15.0) -> None:
    async def healthz(request: web.Request) -> web.Response:
        if pages.healthy():
            return web.Response(text="OK\n")
        return web.Response(status=503, text="not bound to the JetStream consumer (NATS unreachable?)\n")

    async def metrics_page(request: web.Request) -> web.Response:
        return web.Response(body=pages.metrics(), headers={"Content-Type": pages.content_type})

    app = web.Application(client_max_size=1024)
    app.add_routes([web.get("/healthz", healthz, allow_head=True), web.get("/metrics", metrics_page)])
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0, keepalive_timeout=idle_timeout_s,
                           max_line_size=8190, max_field_size=8190, max_headers=100)
    await runner.setup()
    server = runner.server
    assert server is not None

    def factory() -> asyncio.Protocol:
        if len(server.connections) >= max_connections:
            return _Refused()
        return server()

    listener = await asyncio.get_running_loop().create_server(factory, host, port, backlog=128)
    try:
        bound = listener.sockets[0].getsockname()[1] if listener.sockets else port
        log.info("health and metrics on %s:%d", host, bound)
        if started is not None:
            started(bound)
        await stop.wait()
    finally:
        listener.close()
        await runner.cleanup()
