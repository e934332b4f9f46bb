"""``fastgshare-gateway``: flags, wiring and signal handling (the composition root).

Misconfiguration (a bad ``--listen``, an unusable kubeconfig, the FaSTFunc CRD missing, an address in use,
unreadable credentials) is one line on stderr and exit status 1 (2 for a bad flag), never a traceback.
Neither ``--basic-auth-dir`` nor ``--no-auth``: the gateway refuses to start (exit 2, one line). SIGTERM and SIGINT stop
accepting, finish the requests in progress (up to ``--shutdown-timeout``), then stop the watches.
With ``--nats-url``, ``POST /async-function/...`` stores requests in the JetStream stream ``--async-stream``
(:mod:`fastgshare_gateway.jetstream`); NATS unreachable does not stop the gateway: it connects in the
background and async invocations answer 503 until then.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from fastgshare import keys
from fastgshare_gateway import http, queue
from fastgshare_gateway.auth import AuthConfigError, BasicAuth
from fastgshare_gateway.jetstream import AsyncQueue
from fastgshare_gateway.kube import KubeConfigError, KubePodLogs, KubeStore, Watches, load_api_client, missing_crd
from fastgshare_gateway.metrics import GatewayMetrics
from fastgshare_gateway.policy import DEFAULT_MAX_REPLICAS, DeployPolicy
from fastgshare_gateway.pool import Limits
from fastgshare_gateway.routing import Functions
from fastgshare_kube.process import ListenAddressError, parse_listen, stop_on_signals

log = logging.getLogger("fastgshare_gateway")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be > 0")
    return value


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a whole number > 0")
    return int(text)


def _image_prefixes(text: str) -> tuple[str, ...]:
    prefixes = tuple(part.strip() for part in text.split(","))
    if not all(prefixes):
        raise argparse.ArgumentTypeError(f"{text!r}: must be image prefixes separated by commas, none empty, "
                                         "e.g. ghcr.io/my-org/,registry.example:5000/functions/")
    return prefixes






# The flags' defaults are the server's own, read from instances (on slotted attrs classes a class
# attribute is a slot, not the default).
_SERVER_DEFAULTS = http.ServerLimits()
_BODY_TIMEOUT_DEFAULT_S = http.Options().body_timeout_s


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fastgshare-gateway", description=(
        "Route /function/<name>[.<namespace>] to a function's ready pods and serve the OpenFaaS provider API "
        "(/system/...) over FaSTFunc objects, with OpenFaaS's gateway metrics on /metrics."))
    parser.add_argument("--listen", default=f"0.0.0.0:{keys.DEFAULT_GATEWAY_PORT}",
                        help="HOST:PORT (default %(default)s)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster config, else ~/.kube/config)")
    parser.add_argument("--namespace", action="append", dest="namespaces", metavar="NS",
                        help=f"a function namespace; repeat for more (default {keys.DEFAULT_FUNCTION_NAMESPACE}); "
                             "the first is the default of /function/<name> and /system/functions")
    parser.add_argument("--max-queue", type=_positive_int, default=1000,
                        help="requests waiting per function before 429 (default %(default)s)")
    parser.add_argument("--queue-timeout", type=_positive_float, default=30.0,
                        help="seconds a request waits for a pod before 503 (default %(default)s)")
    parser.add_argument("--cold-start-timeout", type=_positive_float, default=120.0,
                        help="seconds a request for a function woken from zero replicas (minReplicas 0) waits "
                             "for its first ready pod before 503 (default %(default)s)")
    parser.add_argument("--pod-max-inflight", type=_positive_int, default=8,
                        help="requests in flight at one pod at most (default %(default)s)")
    parser.add_argument("--upstream-timeout", type=_positive_float, default=60.0,
                        help="seconds for a pod's whole answer before 504 (default %(default)s)")
    parser.add_argument("--shutdown-timeout", type=_positive_float, default=10.0,
                        help="seconds to finish requests in progress on SIGTERM (default %(default)s)")
    access = parser.add_argument_group("access and limits")
    access.add_argument("--basic-auth-dir", type=Path, metavar="DIR",
                        help=f"require HTTP basic auth on /system/* with the credentials in DIR/"
                             f"{keys.BASIC_AUTH_USER_KEY} and DIR/{keys.BASIC_AUTH_PASSWORD_KEY} (the Secret "
                             f"{keys.BASIC_AUTH_SECRET} mounted there; re-read when they change)")
    access.add_argument("--no-auth", action="store_true",
                        help="serve /system/* without credentials (only where nothing untrusted reaches the gateway)")
    access.add_argument("--auth-functions", action="store_true",
                        help="require the same credentials on /function/* too (default: invocations are open, as "
                             "in OpenFaaS)")
    access.add_argument("--max-replicas", type=_positive_int, default=DEFAULT_MAX_REPLICAS,
                        help="most replicas a deploy, update or scale may ask for one function (default %(default)s)")
    access.add_argument("--allowed-image-prefixes", type=_image_prefixes, default=(), metavar="P1,P2",
                        help="only images starting with one of these prefixes may be deployed (default: any image)")
    access.add_argument("--max-connections", type=_positive_int, default=_SERVER_DEFAULTS.max_connections,
                        help="open connections at most; past it the oldest idle one is closed (default %(default)s)")
    access.add_argument("--idle-timeout", type=_positive_float, default=_SERVER_DEFAULTS.idle_timeout_s,
                        help="seconds a connection may take to send a request's headers, new or kept alive "
                             "(default %(default)s)")
    access.add_argument("--body-timeout", type=_positive_float, default=_BODY_TIMEOUT_DEFAULT_S,
                        help="seconds a /system request may take to send its body before 408 (default %(default)s)")
    asynchronous = parser.add_argument_group("asynchronous invocations (POST /async-function/...)")
    asynchronous.add_argument("--nats-url", type=queue.nats_url_argument, default=None, metavar="URL",
                              help="the NATS server with JetStream that stores them, e.g. nats://127.0.0.1:4222 "
                                   "(default: none; /async-function/ answers 501)")
    asynchronous.add_argument("--async-stream", type=queue.stream_argument, default=queue.DEFAULT_STREAM,
                              metavar="NAME",
                              help="the JetStream stream, made when missing; the queue worker reads the same one "
                                   "(default %(default)s)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser


async def run(args: argparse.Namespace, host: str, port: int) -> int:
    credentials = BasicAuth(args.basic_auth_dir) if args.basic_auth_dir else None  # before any API call
    namespaces = list(dict.fromkeys(args.namespaces or [keys.DEFAULT_FUNCTION_NAMESPACE]))
    api = load_api_client(args.kubeconfig)
    for namespace in namespaces:
        if problem := await asyncio.to_thread(missing_crd, api, namespace):
            log.error("%s", problem)
            return 1
    limits = Limits(max_queue=args.max_queue, queue_timeout_s=args.queue_timeout, max_inflight=args.pod_max_inflight)
    functions = Functions(namespaces, limits, GatewayMetrics(), default_namespace=namespaces[0],
                          cold_start_timeout_s=args.cold_start_timeout)
    options = http.Options(upstream_timeout_s=args.upstream_timeout, body_timeout_s=args.body_timeout,
                           auth=credentials,
                           auth_functions=args.auth_functions,
                           policy=DeployPolicy(max_replicas=args.max_replicas,
                                               image_prefixes=args.allowed_image_prefixes))
    if options.auth is None:
        log.warning("--no-auth: /system/* accepts any caller; anyone who reaches the gateway may deploy, scale "
                    "and delete functions")
    async_queue = AsyncQueue(args.nats_url, args.async_stream) if args.nats_url else None
    gateway = http.Gateway(functions, KubeStore(api), options, pod_logs=KubePodLogs(api, namespaces[0]),
                           async_queue=async_queue)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    stop_on_signals(stop.set, loop=loop, logger=log)
    watches = Watches(api, functions, loop)
    watches.start()
    if async_queue is not None:
        await async_queue.start()
    try:
        await http.serve(gateway.app(), host, port, stop, shutdown_timeout_s=args.shutdown_timeout,
                         limits=http.ServerLimits(max_connections=args.max_connections,
                                                  idle_timeout_s=args.idle_timeout))
    finally:
        if async_queue is not None:
            await async_queue.close()
        await asyncio.to_thread(watches.stop)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        host, port = parse_listen(args.listen, "--listen", example="0.0.0.0:8080")
    except ListenAddressError as error:
        parser.error(str(error))
    if args.basic_auth_dir is None and not args.no_auth:
        parser.error(f"--basic-auth-dir DIR is required: the directory holding {keys.BASIC_AUTH_USER_KEY} and "
                     f"{keys.BASIC_AUTH_PASSWORD_KEY} (the Secret {keys.BASIC_AUTH_SECRET}); pass --no-auth to "
                     "serve /system/* to anyone")
    if args.basic_auth_dir is not None and args.no_auth:
        parser.error("--basic-auth-dir and --no-auth: give one of them")
    if args.auth_functions and args.no_auth:
        parser.error("--auth-functions needs credentials: give --basic-auth-dir, not --no-auth")
    try:
        code = asyncio.run(run(args, host, port))
    except (KubeConfigError, AuthConfigError) as error:
        log.error("%s", error)
        return 1
    except OSError as error:
        log.error("cannot serve on %s: %s", args.listen, error)
        return 1
    if code == 0:
        log.info("gateway stopped")
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
