"""The queue worker's listener: ``/healthz`` follows the consumer, ``/metrics`` serves the registry, and
the connection cap closes connections past it."""

from __future__ import annotations

import asyncio
import socket

import aiohttp

from fastgshare_queue import server
from fastgshare_queue.metrics import CONTENT_TYPE, PENDING, QueueMetrics


def test_health_follows_the_consumer_metrics_show_the_pending_count_and_the_cap_holds() -> None:
    async def scenario() -> tuple[list[int], str, bytes]:
        bound = [False]
        metrics = QueueMetrics()
        metrics.set_pending({"resize.team-a": 7})
        stop, ports = asyncio.Event(), asyncio.Queue[int]()
        pages = server.Pages(lambda: bound[0], metrics.exposition, CONTENT_TYPE)
        task = asyncio.create_task(server.serve(pages, "127.0.0.1", 0, stop, started=ports.put_nowait,
                                                max_connections=1))
        port = await ports.get()
        statuses = []
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as client:
            for healthy in (False, True):
                bound[0] = healthy
                async with client.get(f"http://127.0.0.1:{port}/healthz") as answer:
                    statuses.append(answer.status)
            async with client.get(f"http://127.0.0.1:{port}/metrics") as answer:
                text = await answer.text()
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)  # holds the one place
        await asyncio.sleep(0.05)
        loop = asyncio.get_running_loop()
        with socket.create_connection(("127.0.0.1", port)) as second:
            second.setblocking(False)
            refused = await asyncio.wait_for(loop.sock_recv(second, 10), 5)  # closed at once: EOF
        writer.close()
        stop.set()
        await task
        return statuses, text, refused
    statuses, text, refused = asyncio.run(scenario())
    assert statuses == [503, 200]
    assert f'{PENDING}{{function_name="resize.team-a"}} 7.0' in text
    assert refused == b""


def test_functions_gone_from_the_stream_go_to_zero() -> None:
    metrics = QueueMetrics()
    metrics.set_pending({"a.ns": 3, "b.ns": 1})
    metrics.set_pending({"b.ns": 2})
    text = metrics.exposition().decode()
    assert f'{PENDING}{{function_name="a.ns"}} 0.0' in text
    assert f'{PENDING}{{function_name="b.ns"}} 2.0' in text
