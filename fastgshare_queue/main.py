"""``fastgshare-queue-worker``: flags, wiring and signal handling (the composition root).

Bad flags: one line and exit status 2. Unreadable ``--basic-auth-dir`` or a ``--listen`` address in use:
one line and exit status 1. NATS unreachable is no error: the worker retries until it connects (``/healthz``
answers 503 meanwhile). SIGTERM and SIGINT stop taking messages and give the calls in progress up to
``--shutdown-timeout``; the unfinished ones are delivered again (to this or another worker).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
import urllib.parse
from collections.abc import Sequence
from pathlib import Path

from fastgshare_gateway import queue
from fastgshare_gateway.queue import QueueUnavailable
from fastgshare_kube.process import ListenAddressError, parse_listen, stop_on_signals
from fastgshare_queue import server
from fastgshare_queue.calls import CredentialsError, GatewayCalls
from fastgshare_queue.consumer import JetStreamSource
from fastgshare_queue.metrics import CONTENT_TYPE, QueueMetrics
from fastgshare_queue.worker import Settings, Worker

log = logging.getLogger("fastgshare_queue")

DEPTH_INTERVAL_S = 2.0


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be > 0")
    return value


def _count(minimum: int) -> argparse._ActionType:
    def parse(text: str) -> int:
        if not text.isdigit() or int(text) < minimum:
            raise argparse.ArgumentTypeError(f"{text!r}: must be a whole number >= {minimum}")
        return int(text)
    return parse


def _gateway_url(text: str) -> str:
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a URL; allowed: http[s]://HOST[:PORT] (the gateway, "
                                         "e.g. http://gateway.openfaas:8080)")
    return text






_DEFAULTS = Settings()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fastgshare-queue-worker", description=(
        "Run the asynchronous invocations stored by the gateway (POST /async-function/...) in NATS JetStream: "
        "call each function through the gateway, retry on 429 and 5xx, post the answer to X-Callback-Url."))
    parser.add_argument("--nats-url", type=queue.nats_url_argument, default="nats://127.0.0.1:4222", metavar="URL",
                        help="the NATS server with JetStream (default %(default)s)")
    parser.add_argument("--async-stream", type=queue.stream_argument, default=queue.DEFAULT_STREAM, metavar="NAME",
                        help="the stream the gateway writes (its --async-stream; default %(default)s)")
    parser.add_argument("--durable", type=queue.stream_argument, default="fastgshare-queue-worker", metavar="NAME",
                        help="the durable consumer's name, shared by all replicas (default %(default)s)")
    parser.add_argument("--gateway-url", type=_gateway_url, required=True, metavar="URL",
                        help="the gateway that runs the functions (/function/<name>), e.g. http://127.0.0.1:8080")
    parser.add_argument("--basic-auth-dir", type=Path, metavar="DIR",
                        help="the gateway's credentials (basic-auth-user, basic-auth-password: the Secret "
                             "basic-auth mounted there), sent when the gateway runs with --auth-functions")
    parser.add_argument("--max-inflight", type=_count(1), default=_DEFAULTS.max_inflight,
                        help="calls in progress per function at most (default %(default)s)")
    parser.add_argument("--max-held", type=_count(1), default=_DEFAULTS.max_held,
                        help="messages taken and not yet acknowledged, all functions (default %(default)s)")
    parser.add_argument("--max-retries", type=_count(0), default=_DEFAULTS.max_retries,
                        help="calls again after 429, 5xx or no gateway, and callbacks again (default %(default)s)")
    parser.add_argument("--retry-base", type=_positive_float, default=_DEFAULTS.retry_base_s, metavar="SECONDS",
                        help="the first back-off, doubled each retry (default %(default)s)")
    parser.add_argument("--retry-max", type=_positive_float, default=_DEFAULTS.retry_max_s, metavar="SECONDS",
                        help="the longest back-off (default %(default)s)")
    parser.add_argument("--ack-wait", type=_positive_float, default=_DEFAULTS.ack_wait_s, metavar="SECONDS",
                        help="JetStream delivers a message again when its worker is silent this long "
                             "(a new consumer only; default %(default)s)")
    parser.add_argument("--invoke-timeout", type=_positive_float, default=120.0, metavar="SECONDS",
                        help="a call's whole answer at most, then 504 (default %(default)s)")
    parser.add_argument("--callback-timeout", type=_positive_float, default=10.0, metavar="SECONDS",
                        help="a callback's answer at most (default %(default)s)")
    parser.add_argument("--shutdown-timeout", type=_positive_float, default=_DEFAULTS.shutdown_timeout_s,
                        metavar="SECONDS", help="calls in progress finish within this on SIGTERM (default %(default)s)")
    parser.add_argument("--listen", default="0.0.0.0:8081",
                        help="/healthz and /metrics, HOST:PORT (default %(default)s)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser


async def _watch_depths(source: JetStreamSource, metrics: QueueMetrics, stop: asyncio.Event) -> None:
    while not stop.is_set():
        if source.bound:
            try:
                depths = await source.depths()
                metrics.set_pending({f"{name}.{namespace}": count for (namespace, name), count in depths.items()})
            except QueueUnavailable as error:
                log.debug("queue depth not read: %s", error)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), DEPTH_INTERVAL_S)


async def run(args: argparse.Namespace, host: str, port: int) -> int:
    metrics = QueueMetrics()
    settings = Settings(max_inflight=args.max_inflight, max_held=args.max_held, max_retries=args.max_retries,
                        retry_base_s=args.retry_base, retry_max_s=args.retry_max, ack_wait_s=args.ack_wait,
                        shutdown_timeout_s=args.shutdown_timeout)
    calls = GatewayCalls(args.gateway_url, basic_auth_dir=args.basic_auth_dir, invoke_timeout_s=args.invoke_timeout,
                         callback_timeout_s=args.callback_timeout)
    source = JetStreamSource(args.nats_url, args.async_stream, args.durable, ack_wait_s=args.ack_wait,
                             max_held=args.max_held)
    stop = asyncio.Event()
    stop_on_signals(stop.set, loop=asyncio.get_running_loop(), logger=log)
    await calls.start()
    listener = asyncio.ensure_future(server.serve(server.Pages(lambda: source.bound, metrics.exposition, CONTENT_TYPE),
                                                  host, port, stop))
    depths = asyncio.ensure_future(_watch_depths(source, metrics, stop))
    try:
        await asyncio.sleep(0)
        if listener.done():
            listener.result()  # the address in use: raise now
        if await source.start(stop):
            await Worker(calls, metrics, settings).run(source, stop)
    finally:
        stop.set()
        await asyncio.gather(depths, return_exceptions=True)
        await source.close()
        await calls.close()
        if listener.done():
            listener.result()
        else:
            await listener
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        host, port = parse_listen(args.listen, "--listen", example="0.0.0.0:8081")
    except ListenAddressError as error:
        parser.error(str(error))
    try:
        code = asyncio.run(run(args, host, port))
    except CredentialsError as error:
        log.error("%s", error)
        return 1
    except OSError as error:
        log.error("cannot serve on %s: %s", args.listen, error)
        return 1
    if code == 0:
        log.info("queue worker stopped")
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
