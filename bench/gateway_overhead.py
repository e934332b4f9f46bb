"""The gateway's added latency and its highest sustained rate (prints one JSON object).

Three processes on loopback: an upstream standing in for a function pod (aiohttp, answers a 64-byte body),
one ``fastgshare-gateway`` process (the real app, the function's endpoint injected, no Kubernetes) and this
process as the load generator (aiohttp client, keep-alive connections).

1. Open loop at ``--rate`` (default 200) req/s for ``--seconds``: latency p50/p99 calling the upstream
   directly, then through the gateway, side by side; ``added_ms_p50``/``added_ms_p99`` are the differences.
2. Closed loop with ``--concurrency`` clients for ``--seconds``: requests per second through the gateway
   (``max_rps_gateway``) and directly (``max_rps_direct``, the load generator's and upstream's own ceiling:
   the gateway's figure is a lower bound when the two are close). Both on the same machine's cores.

Run: ``python -m bench.gateway_overhead``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import aiohttp
from aiohttp import web

from fastgshare import keys
from fastgshare_gateway.endpoints import Endpoint
from fastgshare_gateway.http import Gateway, serve
from fastgshare_gateway.metrics import GatewayMetrics
from fastgshare_gateway.pool import Limits
from fastgshare_gateway.routing import Functions

BODY = b"x" * 64
FN = (keys.DEFAULT_FUNCTION_NAMESPACE, "bench")


async def _upstream(stop: asyncio.Event) -> None:
    async def handler(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=BODY)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, backlog=1024).start()
    print(runner.addresses[0][1], flush=True)
    await stop.wait()


async def _gateway(upstream: str, stop: asyncio.Event) -> None:
    functions = Functions([FN[0]], Limits(max_queue=100_000, max_inflight=1024), GatewayMetrics())
    functions.replace_pods([])
    functions.set_endpoints(FN, [Endpoint("pod", upstream)])
    await serve(Gateway(functions).app(), "127.0.0.1", 0, stop, started=lambda port: print(port, flush=True))


def _serve(role: str, upstream: str) -> None:
    async def main() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_reader(sys.stdin.fileno(), stop.set)  # stdin closed: stop
        await (_upstream(stop) if role == "upstream" else _gateway(upstream, stop))
    asyncio.run(main())


def _start(role: str, upstream: str = "") -> tuple[subprocess.Popen[str], int]:
    command = [sys.executable, "-m", "bench.gateway_overhead", "--serve", role, "--upstream", upstream]
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    return process, int(process.stdout.readline())


async def _open_loop(url: str, rate: float, seconds: float) -> dict[str, Any]:
    latencies: list[float] = []
    failures = 0
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as client:
        async def one() -> None:
            nonlocal failures
            started = time.perf_counter()
            try:
                async with client.get(url) as answer:
                    await answer.read()
                    if answer.status != 200:
                        failures += 1
                        return
            except aiohttp.ClientError:
                failures += 1
                return
            latencies.append(time.perf_counter() - started)

        for _ in range(20):  # warm the connections
            await one()
        latencies.clear()
        tasks = []
        start = time.perf_counter()
        count = int(rate * seconds)
        for index in range(count):
            delay = start + index / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one()))
        await asyncio.gather(*tasks)
    quantiles = statistics.quantiles(latencies, n=100) if len(latencies) >= 2 else [float("nan")] * 99
    return {"requests": count, "failures": failures, "p50_ms": round(quantiles[49] * 1000, 3),
            "p99_ms": round(quantiles[98] * 1000, 3)}


async def _closed_loop(url: str, concurrency: int, seconds: float) -> dict[str, Any]:
    done = failures = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as client:
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal done, failures
            while time.perf_counter() < deadline:
                try:
                    async with client.get(url) as answer:
                        await answer.read()
                        done, failures = done + (answer.status == 200), failures + (answer.status != 200)
                except aiohttp.ClientError:
                    failures += 1
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return {"rps": round(done / elapsed, 1), "failures": failures}


def measure(rate: float, seconds: float, concurrency: int) -> dict[str, Any]:
    upstream, upstream_port = _start("upstream")
    gateway, gateway_port = _start("gateway", f"127.0.0.1:{upstream_port}")
    try:
        direct_url = f"http://127.0.0.1:{upstream_port}/"
        gateway_url = f"http://127.0.0.1:{gateway_port}/function/{FN[1]}/"
        direct = asyncio.run(_open_loop(direct_url, rate, seconds))
        through = asyncio.run(_open_loop(gateway_url, rate, seconds))
        max_direct = asyncio.run(_closed_loop(direct_url, concurrency, seconds))
        max_gateway = asyncio.run(_closed_loop(gateway_url, concurrency, seconds))
    finally:
        for process in (gateway, upstream):
            assert process.stdin is not None
            process.stdin.close()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
    return {
        "benchmark": "gateway_overhead", "rate_rps": rate, "seconds": seconds, "cpus": os.cpu_count(),
        "direct": direct, "gateway": through,
        "added_ms_p50": round(through["p50_ms"] - direct["p50_ms"], 3),
        "added_ms_p99": round(through["p99_ms"] - direct["p99_ms"], 3),
        "concurrency": concurrency, "max_rps_direct": max_direct["rps"], "max_rps_gateway": max_gateway["rps"],
        "max_failures_gateway": max_gateway["failures"],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--serve", choices=["upstream", "gateway"], help=argparse.SUPPRESS)
    parser.add_argument("--upstream", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        _serve(args.serve, args.upstream)
        return 0
    print(json.dumps(measure(args.rate, args.seconds, args.concurrency)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
