"""A gateway process for the queue tests: the real HTTP edge (:class:`fastgshare_gateway.http.Gateway`) and
JetStream adapter, with no Kubernetes: the functions' endpoints come from ``--function NAME=HOST:PORT``.
Prints ``PORT <n>`` once it is connected to NATS and listening."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from fastgshare import keys
from fastgshare_gateway import http
from fastgshare_gateway.endpoints import Endpoint
from fastgshare_gateway.jetstream import AsyncQueue
from fastgshare_gateway.metrics import GatewayMetrics
from fastgshare_gateway.pool import Limits
from fastgshare_gateway.routing import Functions
from fastgshare_kube.process import stop_on_signals

NS = keys.DEFAULT_FUNCTION_NAMESPACE


async def run(args: argparse.Namespace) -> None:
    functions = Functions([NS], Limits(), GatewayMetrics())
    functions.replace_pods([])
    for spec in args.function:
        name, _, address = spec.partition("=")
        functions.set_endpoints((NS, name), [Endpoint(f"{name}-0", address)])
    queue = AsyncQueue(args.nats_url, args.stream)
    await queue.start()
    while not queue.connected:
        await asyncio.sleep(0.05)
    gateway = http.Gateway(functions, None, http.Options(), async_queue=queue)
    stop = asyncio.Event()
    stop_on_signals(stop.set, loop=asyncio.get_running_loop())
    try:
        await http.serve(gateway.app(), "127.0.0.1", 0, stop,
                         started=lambda port: print(f"PORT {port}", flush=True), shutdown_timeout_s=1.0)
    finally:
        await queue.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nats-url", required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--function", action="append", default=[])
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s gateway %(levelname)s %(message)s")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
